"""The layer order of ``docs/design.md``, held as data: a package imports only packages below it.

Every import counts, lazy and ``TYPE_CHECKING`` ones included (an import inside a function is still a
dependency); imports within one package are free. Packages in one layer may import each other as long as
no cycle forms between them.
"""

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "gyre"

LAYERS: list[tuple[str, ...]] = [
    ("__init__", "types", "seeding"),  # records
    ("algos",),  # pure maths
    ("models",),  # model loading, LoRA, presets
    ("engines",),  # rollout engines and trainer backends, with their own specs
    ("config",),  # the strict schema: assembles the specs below it; the device and model-shape catalog
    ("data",),
    ("rewards",),
    ("envs",),
    ("cluster",),  # hosting: role groups, transport, placement, weight channels, faults
    ("training", "rollout", "tracking"),
    ("pipelines", "sim"),  # controllers; the simulated cluster behind the rollout's port
    ("app", "tasks", "recipes"),  # the application shell
]
RANK = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}


def _package(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "gyre":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def imports() -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> "file:line module" for every import between packages."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        module = ".".join(rel.parts).removesuffix(".__init__")
        source = _package(module)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: resolve against this module's package
                    base = module.split(".")[: len(module.split(".")) - node.level + (path.name == "__init__.py")]
                    names = [".".join([*base, node.module] if node.module else base)]
                else:
                    names = [node.module or ""]
            else:
                continue
            for name in names:
                target = _package(name)
                if target is not None and target != source:
                    edges[(source, target)].append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {name}")
    return edges


def test_every_package_has_a_layer():
    packages = {p.stem if p.is_file() else p.name for p in ROOT.iterdir()
                if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"}
    assert packages == set(RANK), f"packages without a layer: {packages - set(RANK)}; layers without a package: " \
                                  f"{set(RANK) - packages}"


def test_no_package_imports_a_package_above_it():
    upward = [f"{where} ({src} -> {dst})" for (src, dst), sites in imports().items() if RANK[dst] > RANK[src]
              for where in sites]
    assert not upward, f"{len(upward)} upward imports:\n" + "\n".join(upward)


def test_no_cycle_between_packages():
    graph: dict[str, set[str]] = defaultdict(set)
    for src, dst in imports():
        graph[src].add(dst)
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*path[path.index(nxt):], nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, cycles


# ---- the picture in docs/design.md -----------------------------------------------------------------
FIGURE = ROOT.parent / "docs" / "layers.svg"
_NAMES = ["records", "maths", "models", "engines", "config", "data", "rewards", "envs", "hosting",
          "services", "controllers", "shell"]


def draw() -> str:
    """``docs/layers.svg``: the layers bottom to top, a box per package with how many packages it imports
    (every one of them lower: the arrow on the left is the only direction an import may take)."""
    width, row, box_w, box_h, left = 640, 40, 130, 28, 150
    height = row * len(LAYERS) + 16
    uses: dict[str, set[str]] = defaultdict(set)
    for src, dst in imports():
        uses[src].add(dst)
    shapes = [f'<line x1="128" y1="14" x2="128" y2="{height - 14}" class="arrow"/>',
              f'<path d="M122 {height - 24} L128 {height - 12} L134 {height - 24}" class="head"/>']
    for i, layer in enumerate(LAYERS):
        y = height - 8 - (i + 1) * row + (row - box_h) / 2
        shapes.append(f'<text x="8" y="{y + 18:.0f}" class="layer">{i + 1}. {_NAMES[i]}</text>')
        for k, pkg in enumerate(layer):
            x = left + k * (box_w + 14)
            label = {"__init__": "gyre/__init__"}.get(pkg, pkg if pkg in ("types", "seeding") else pkg + "/")
            count = f" ({len(uses[pkg])})" if uses[pkg] else ""
            shapes.append(f'<rect x="{x}" y="{y:.0f}" width="{box_w}" height="{box_h}" rx="4"/>'
                          f'<text x="{x + box_w / 2}" y="{y + 18:.0f}" class="pkg">{label}{count}</text>')
    style = ("rect{fill:#eef3fb;stroke:#4a6fa5} .arrow{stroke:#4a6fa5;stroke-width:2} .head{fill:none;"
             "stroke:#4a6fa5;stroke-width:2} text{font-family:sans-serif;font-size:13px} .pkg{text-anchor:middle}"
             " .layer{fill:#555}")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}"><style>{style}</style>\n' + "\n".join(shapes) + "\n</svg>\n")


def test_the_picture_in_the_design_notes_is_current():
    assert FIGURE.read_text() == draw(), "docs/layers.svg is stale: python -m tests.test_layers --write"


if __name__ == "__main__":
    import sys

    if "--write" in sys.argv:
        FIGURE.write_text(draw())
        print(f"wrote {FIGURE}")
