"""Code test sets in the layouts public datasets ship, as the two forms the code reward runs.

The code reward runs stdin/stdout tests (``{"inputs": [...], "outputs": [...]}``) or assert tests
(``{"asserts": [...], "setup": "..."}``). Datasets write tests in other shapes; each maps onto one of
those two here, with no guessing beyond the shape itself:

- a list of assert strings (MBPP's ``test_list``): the asserts;
- HumanEval's ``{"test": "def check(candidate): ...", "entry_point": "f"}``: one assert test, the test code
  followed by ``check(f)`` (``data.answer_key: {test: test, entry_point: entry_point}`` builds it);
- APPS / TACO ``input_output`` (JSON text or an object): stdin/stdout tests; with ``fn_name``, call tests:
  each input is the argument list and the output the return value, where (as APPS' own checker allows)
  an output written as a one-item list also matches its item;
- inputs or outputs written as lists of lines: joined with newlines.
"""

from __future__ import annotations

import json
from typing import Any


def canonical_tests(data: Any) -> Any:
    """``data`` (a decoded ground truth) in one of the two forms the code reward runs; anything else is
    returned as it is, for the reward's own error."""
    if isinstance(data, list) and data and all(isinstance(t, str) for t in data):
        return {"asserts": list(data)}
    if not isinstance(data, dict):
        return data
    if "input_output" in data and not ({"inputs", "outputs", "asserts"} & set(data)):
        inner = data["input_output"]
        if isinstance(inner, str):
            try:
                inner = json.loads(inner)
            except json.JSONDecodeError as exc:
                raise ValueError(f"code ground truth: 'input_output' is not valid JSON ({exc.msg})") from None
        return canonical_tests(inner)
    if isinstance(data.get("test"), str) and not ({"asserts", "inputs", "outputs"} & set(data)):
        entry = data.get("entry_point")
        if entry is not None and (not isinstance(entry, str) or not entry.isidentifier()):
            raise ValueError(f"code ground truth: 'entry_point' must be a function name, got {entry!r}")
        test = data["test"] + (f"\n\ncheck({entry})\n" if entry else "")
        return {"asserts": [test], **({"setup": data["setup"]} if "setup" in data else {})}
    if "inputs" in data and "outputs" in data and "asserts" not in data:
        if data.get("fn_name"):
            return _call_tests(data["fn_name"], data["inputs"], data["outputs"])
        return {**data, "inputs": _texts(data["inputs"], True), "outputs": _texts(data["outputs"], False)}
    return data


def _texts(values: Any, newline: bool) -> Any:
    """Each test's text; a list of lines joined (inputs end with a newline, as a terminal would send them)."""
    if not isinstance(values, list):
        return values
    return [("\n".join(v) + ("\n" if newline else "")) if isinstance(v, list) and all(isinstance(x, str) for x in v)
            else v for v in values]


def _call_tests(fn_name: Any, inputs: Any, outputs: Any) -> dict:
    """APPS' call-based tests as asserts ``fn(args...) in [expected, expected[0]]``: plain literals only."""
    if not isinstance(fn_name, str) or not fn_name.isidentifier():
        raise ValueError(f"code ground truth: 'fn_name' must be a function name, got {fn_name!r}")
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs) or not inputs:
        raise ValueError("code ground truth: call tests need equally long, non-empty 'inputs' and 'outputs' lists")
    asserts = []
    for args, expected in zip(inputs, outputs):
        call = f"{fn_name}({', '.join(repr(a) for a in args) if isinstance(args, list) else repr(args)})"
        choices = [expected, expected[0]] if isinstance(expected, list) and len(expected) == 1 else [expected]
        asserts.append(f"assert {call} in {choices!r}")
    return {"asserts": asserts}
