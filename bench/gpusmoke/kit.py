"""The GPU smoke check's kit: the wheels a GPU box lacks, small enough to travel with the checkout.

A typical single-GPU box (docs: the README's "GPU smoke check") has torch, transformers, peft and pytest but
not Ray or pydantic, and no package index. ``build`` (here, where pip reaches PyPI) downloads the wheels of
Ray, pydantic, pytest and everything they need, for the box's Python and x86-64 Linux, at the versions this
environment runs (the combination the tests pass on), strips what gyre never loads from Ray's wheel (its Java
jars, RLlib, the dashboard's source maps: 79 MB -> about 44 MB), and refuses a kit that would take the
checkout past what a device call carries. ``unpack`` (on the box, standard library and ``packaging`` only)
extracts into one directory the wheels the box does not already satisfy; ``make gpu-smoke`` puts that
directory on PYTHONPATH.

    python bench/gpusmoke/kit.py build --out build/gpu-kit --python-version 3.12
    python bench/gpusmoke/kit.py unpack --kit build/gpu-kit --site /tmp/gyre-gpu-kit   # prints the site, or nothing
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

LIMIT_BYTES = 64 << 20
"""What one device call carries: the checkout (tracked and untracked, not ignored, files) plus the kit."""
ROOTS = ("ray", "pydantic")
"""Missing on the box by assumption: always installed from the kit (and their requirements, where the box
does not satisfy them)."""
ALSO = ("pytest", "pytest-timeout", "pyyaml", "math-verify")
"""What the smoke check runs with that most GPU boxes have: carried too, installed only where missing
(math-verify: the default reward of the GPU run among the tests CI skips)."""
NOT_CARRIED = ("torch", "numpy", "sympy", "mpmath")
"""Every box with torch has these (sympy is 6 MB): the requirements are not followed into them."""
STRIP = {"ray": ("ray/jars/*", "ray/rllib/*", "ray/dashboard/client/build/*.map")}
"""Members dropped from a wheel: Ray's Java jars (32 MB compressed) and RLlib, which gyre never loads, and
the dashboard's JavaScript source maps (gyre starts Ray without its dashboard)."""
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
_PIP_TIMEOUT_S = 600


def canonical(name: str) -> str:
    """A distribution name as wheel files and metadata compare it (PEP 503, with underscores)."""
    return name.lower().replace("-", "_").replace(".", "_")


def closure(roots, python_version: str) -> dict[str, str]:
    """Every distribution ``roots`` need (extras left out), by canonical name, at the version installed in
    this environment; markers are evaluated for CPython ``python_version`` on x86-64 Linux."""
    from importlib import metadata

    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    env = {**default_environment(), "python_version": python_version, "python_full_version": f"{python_version}.0",
           "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
    found: dict[str, str] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        key = canonical(name)
        if key in found or key in map(canonical, NOT_CARRIED):
            continue
        found[key] = metadata.version(name)
        for line in metadata.requires(name) or ():
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate(env):
                todo.append(req.name)
    return dict(sorted(found.items()))


def strip_wheel(src: Path, dst: Path, patterns) -> dict:
    """Copy wheel ``src`` to ``dst`` without the members matching ``patterns`` (fnmatch, ``*`` crossing
    folders), rewriting its RECORD to match, recompressed at the highest level. Returns what was dropped."""
    dropped, kept = [], []
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        infos = zin.infolist()
        gone = {i.filename for i in infos if any(fnmatch.fnmatch(i.filename, p) for p in patterns)}
        for info in infos:
            if info.filename in gone:
                dropped.append(info.compress_size)
                continue
            data = zin.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(line for line in lines if line.split(",", 1)[0] not in gone).encode()
            zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
            kept.append(info.filename)
    return {"dropped_files": len(dropped), "dropped_compressed_bytes": sum(dropped), "kept_files": len(kept)}


def checkout_bytes(root: Path) -> int:
    """Bytes of what a device call sends besides carried paths: tracked and untracked, not ignored, files."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, check=True, timeout=60).stdout.decode()
    return sum((root / p).stat().st_size for p in out.split("\0") if p and (root / p).is_file())


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def size_problem(kit_bytes: int, checkout: int, limit: int = LIMIT_BYTES) -> str | None:
    """Why the kit cannot travel with the checkout, or None."""
    if kit_bytes + checkout <= limit:
        return None
    return (f"the kit ({kit_bytes / 2**20:.1f} MiB) and the checkout ({checkout / 2**20:.1f} MiB) come to "
            f"{(kit_bytes + checkout) / 2**20:.1f} MiB, over the {limit / 2**20:.0f} MiB a device call carries: "
            "strip more from the largest wheel (STRIP) or drop a distribution the box already has")


def download(pins: dict[str, str], dest: Path, python_version: str) -> None:
    """Wheels of ``pins`` (name -> version) for the box, into ``dest`` (a cache: present ones are kept)."""
    dest.mkdir(parents=True, exist_ok=True)
    have = {canonical(p.name.split("-")[0]) + "==" + p.name.split("-")[1] for p in dest.glob("*.whl")}
    missing = [f"{name}=={version}" for name, version in pins.items() if f"{name}=={version}" not in have]
    if not missing:
        return
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", python_version, "--implementation", "cp", *platforms, "-d", str(dest),
                    *missing], check=True, timeout=_PIP_TIMEOUT_S)


def build(out: Path, python_version: str, cache: Path, root: Path) -> int:
    """Make the kit in ``out``; returns the exit status (1: too large to carry)."""
    pins = closure(ROOTS + ALSO, python_version)
    cache = cache / f"py{python_version}"  # a cached wheel of one Python's ABI is no use to another
    download(pins, cache, python_version)
    shutil.rmtree(out, ignore_errors=True)
    (out / "wheels").mkdir(parents=True)
    wheels = []
    for name, version in pins.items():
        [src] = [p for p in cache.glob("*.whl") if canonical(p.name.split("-")[0]) == name
                 and p.name.split("-")[1] == version]
        dst = out / "wheels" / src.name
        stripped = None
        if name in STRIP:
            stripped = strip_wheel(src, dst, STRIP[name])
        else:
            shutil.copyfile(src, dst)
        wheels.append({"name": name, "version": version, "file": src.name, "root": name in map(canonical, ROOTS),
                       "bytes": dst.stat().st_size, **({"stripped": stripped} if stripped else {})})
    manifest = {"python": python_version, "platform": "x86_64 Linux", "wheels": wheels}
    (out / "kit.json").write_text(json.dumps(manifest, indent=1) + "\n")
    kit, checkout = tree_bytes(out), checkout_bytes(root)
    for w in sorted(wheels, key=lambda w: -w["bytes"])[:5]:
        print(f"  {w['bytes'] / 2**20:6.1f} MiB  {w['file']}")
    print(f"kit: {out} {kit / 2**20:.1f} MiB in {len(wheels)} wheels for Python {python_version}; checkout "
          f"{checkout / 2**20:.1f} MiB; together {(kit + checkout) / 2**20:.1f} of {LIMIT_BYTES / 2**20:.0f} MiB")
    problem = size_problem(kit, checkout)
    if problem:
        print(f"FAILED: {problem}", file=sys.stderr)
        return 1
    return 0


def _box_satisfies(name: str, version_specs: list[str]) -> bool:
    """The running Python already has distribution ``name`` at a version every spec in ``version_specs``
    allows (without ``packaging``, any installed version counts)."""
    from importlib import metadata

    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    try:
        from packaging.specifiers import SpecifierSet
    except ImportError:
        return True
    return all(SpecifierSet(spec).contains(have, prereleases=True) for spec in version_specs)


def _requirements_on(wheels: list[Path]) -> dict[str, list[str]]:
    """What the kit's wheels require of each distribution (canonical name -> version specifiers), for this
    Python (markers evaluated here, extras left out)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        return {}
    specs: dict[str, list[str]] = {}
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
            for line in z.read(meta).decode().splitlines():
                if line.startswith("Requires-Dist:"):
                    req = Requirement(line.split(":", 1)[1].strip())
                    if req.marker is None or req.marker.evaluate({"extra": ""}):
                        specs.setdefault(canonical(req.name), []).append(str(req.specifier))
    return specs


def _extract(wheel: Path, site: Path) -> None:
    """Unzip a wheel into ``site`` as an installer would lay it out (its purelib/platlib data merged in,
    scripts and headers left out), keeping each file's permission bits (Ray's raylet is a program)."""
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            name = info.filename
            if name.split("/", 1)[0].endswith(".data"):
                parts = name.split("/", 2)
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                name = parts[2]
            target = (site / name).resolve()
            if site.resolve() not in target.parents:
                raise ValueError(f"{wheel.name}: member {info.filename!r} would land outside {site}")
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                os.chmod(target, mode)


def unpack(kit: Path, site: Path) -> Path | None:
    """Extract the kit's wheels this Python needs into ``site``; returns ``site``, or None where Ray and
    pydantic already import (this environment needs no kit) or there is no kit."""
    if all(importlib.util.find_spec(name) is not None for name in ROOTS):
        print("gpu kit: not needed (ray and pydantic import here)", file=sys.stderr)
        return None
    if not (kit / "kit.json").is_file():
        print(f"gpu kit: none at {kit} (make gpu-kit builds it); sections that need Ray or pydantic will fail",
              file=sys.stderr)
        return None
    text = (kit / "kit.json").read_text()
    manifest = json.loads(text)
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if manifest["python"] != here:
        raise SystemExit(f"gpu kit: built for Python {manifest['python']}, this is {here}: rebuild it here with "
                         f"make gpu-kit KIT_PYTHON={here}")
    stamp = site / ".gyre-kit"
    digest = hashlib.sha256(text.encode()).hexdigest()
    if stamp.is_file() and stamp.read_text() == digest:
        return site
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    wheels = [kit / "wheels" / w["file"] for w in manifest["wheels"]]
    specs = _requirements_on(wheels)
    used, box = [], []
    for entry, wheel in zip(manifest["wheels"], wheels):
        if not entry["root"] and _box_satisfies(entry["name"], specs.get(entry["name"], [])):
            box.append(entry["name"])
            continue
        _extract(wheel, site)
        used.append(f"{entry['name']}=={entry['version']}")
    (site / "gyre-kit-install.json").write_text(json.dumps({"from_kit": used, "from_box": box}, indent=1) + "\n")
    stamp.write_text(digest)
    print(f"gpu kit: {len(used)} distributions unpacked into {site}; the box's own kept: {', '.join(box) or 'none'}",
          file=sys.stderr)
    return site


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="download and strip the wheels (here, where pip works)")
    b.add_argument("--out", type=Path, default=Path("build/gpu-kit"))
    b.add_argument("--cache", type=Path, default=Path("build/gpu-kit-cache"), help="downloaded wheels, kept")
    b.add_argument("--python-version", default="3.12", help="the GPU box's Python (major.minor)")
    u = sub.add_parser("unpack", help="on the box: extract what it lacks; prints the directory to add to "
                       "PYTHONPATH (nothing when none is needed)")
    u.add_argument("--kit", type=Path, default=Path("build/gpu-kit"))
    u.add_argument("--site", type=Path, default=Path("/tmp/gyre-gpu-kit"))
    args = parser.parse_args(argv)
    if args.command == "build":
        return build(args.out, args.python_version, args.cache, Path(__file__).resolve().parents[2])
    site = unpack(args.kit, args.site)
    if site is not None:
        print(site)
    return 0


if __name__ == "__main__":
    sys.exit(main())
