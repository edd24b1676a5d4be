"""The project's structural rules, checked on every run: lint, sizes, pure algorithms, unique names."""

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = sorted((ROOT / "gyre").rglob("*.py"))


def test_ruff_is_clean():
    ruff = shutil.which("ruff") or str(Path(__import__("sys").executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed (pip install -e .[dev])")
    result = subprocess.run([ruff, "check", "gyre", "tests", "examples", "bench"], cwd=ROOT, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout


def test_functions_and_files_stay_small():
    problems = []
    for path in PACKAGE:
        text = path.read_text()
        if text.count("\n") > 600:
            problems.append(f"{path.name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > 80:
                    problems.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}() has {length} lines")
    assert not problems, problems


def test_algorithms_are_pure():
    for path in (ROOT / "gyre" / "algos").rglob("*.py"):
        imports = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imports.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                imports.add((node.module or "").split(".")[0])
        allowed = {"__future__", "dataclasses", "importlib", "typing", "math", "torch", "numpy", "gyre"}
        assert set(imports) <= allowed, path


def test_class_names_are_unique_and_no_eval():
    seen: dict[str, Path] = {}
    for path in PACKAGE:
        text = path.read_text()
        assert not re.search(r"(?<![\w.])eval\(", text), f"{path}: eval() is not allowed"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                assert node.name not in seen, f"class {node.name} in both {seen[node.name]} and {path}"
                seen[node.name] = path
