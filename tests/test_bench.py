"""Every benchmark has a smallest-size run (``--smoke``) that ``make bench-smoke`` runs, and CI runs that: a
benchmark nothing runs rots (four did, on a config key the schema had stopped accepting). Checked from the
sources; the runs themselves take minutes and belong to ``make bench-smoke``."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "bench").glob("*.py"))


def _options(path: Path) -> set[str]:
    """The literal option strings of every ``add_argument`` call in ``path``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            found |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return found


def test_there_are_benchmarks():
    assert len(SCRIPTS) >= 13, [p.name for p in SCRIPTS]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_benchmark_has_a_smoke_run(script):
    source = script.read_text()
    assert "--smoke" in _options(script), (
        f"bench/{script.name} has no --smoke option: give it a smallest-size run of its real path (a step or two, "
        "the tiny model, the fewest sizes) that make bench-smoke and CI can run")
    assert re.search(r'^if __name__ == "__main__":', source, re.M), f"bench/{script.name} cannot be run as a script"


def test_make_bench_smoke_runs_every_script_and_ci_runs_it():
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^bench-smoke:.*?(?=^\S|\Z)", makefile, re.M | re.S)
    assert recipe and "bench/*.py" in recipe.group(0) and "--smoke" in recipe.group(0), "make bench-smoke"
    ci = [line.split("#")[0].strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    tests = [i for i, line in enumerate(ci) if line.startswith("make test")]
    assert "make bench-smoke" in ci and tests and ci.index("make bench-smoke") > tests[0], ".ci/run"
