"""Run configs shipped inside the package (``gyre quickstart`` uses quickstart.yaml)."""

from __future__ import annotations

from pathlib import Path


def recipe_path(name: str) -> Path:
    path = Path(__file__).with_name(f"{name}.yaml")
    if not path.is_file():
        available = sorted(p.stem for p in Path(__file__).parent.glob("*.yaml"))
        raise FileNotFoundError(f"no recipe {name!r}; available: {', '.join(available)}")
    return path
