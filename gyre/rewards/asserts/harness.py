"""The programs the sandbox runs for a planned assert test: encode leaf values as plain data."""

from __future__ import annotations

import ast
import builtins
import inspect
import json
import re

from gyre.rewards.asserts import judge
from gyre.rewards.asserts.plan import AssertPlan, bound_names

# Defined in the sandboxed program before anything else runs. The program can rebind these (it runs in
# the same module), which gains it nothing: forging the data is no more than returning that data.
_ENCODE = '''
def __gyre_encode(v, depth=0):
    if depth > 60:
        raise ValueError("value nested too deeply")
    if v is None:
        return ["n"]
    for kind, types in (("b", bool), ("i", int), ("f", float), ("c", complex), ("s", str),
                        ("y", (bytes, bytearray))):
        if isinstance(v, types):
            break
    else:
        kind = type(v).__name__
    if kind == "b":
        return ["b", v is True]
    if kind == "i":
        return ["i", hex(int.__index__(v))]
    if kind == "f":
        return ["f", float.hex(float(v))]
    if kind == "c":
        return ["c", float.hex(v.real), float.hex(v.imag)]
    if kind == "s":
        return ["s", str.__str__(v)]
    if kind == "y":
        return ["y", bytes(v).hex()]
    if kind == "Fraction":
        return ["q", hex(v.numerator), hex(v.denominator)]
    if kind == "Decimal":
        return ["D", str(v)]
    if isinstance(v, dict):
        return ["d", [[__gyre_encode(k, depth + 1), __gyre_encode(x, depth + 1)] for k, x in v.items()]]
    for tag, types in (("l", list), ("t", tuple), ("S", set), ("F", frozenset)):
        if isinstance(v, types):
            return [tag, [__gyre_encode(x, depth + 1) for x in v]]
    raise TypeError(f"a {kind} cannot be compared outside the sandbox; return plain data")


def __gyre_emit(fd, leaves):
    import json as __json, os as __os
    out = []
    for leaf in leaves:
        try:
            out.append({"v": __gyre_encode(leaf())})
        except BaseException as e:
            out.append({"e": f"{type(e).__name__}: {str(e)[:200]}"})
    __os.write(fd, __json.dumps(out).encode())
    __os.close(fd)
'''

_DECODE = re.sub(r"\bdecode\(", "__gyre_decode(", inspect.getsource(judge.decode))
"""The parent's decoder, renamed: the helper run decodes the program's values exactly as the parent does."""


def _lambdas(sources: list[str]) -> str:
    return "[" + ", ".join(f"lambda: ({s})" for s in sources) + "]"


def test_program(plan: AssertPlan, setup: str, code: str) -> str:
    """The sandboxed program: setup, the test's input constants, reference leaves (fd 3, closed before
    the program starts), the response's code, program leaves (fd 4)."""
    inputs = [f"{name} = {source}" for name, source in plan.inputs.items()]
    return "\n".join([_ENCODE, setup, *inputs, f"__gyre_emit(3, {_lambdas(plan.reference)})",
                      "__name__ = 'solution'", code, "__name__ = '__main__'",
                      f"__gyre_emit(4, {_lambdas(plan.program)})"])


def helper_program(plan: AssertPlan, setup: str, indices: list[int], arguments: list[tuple[list, dict]]) -> str:
    """The second run, without the program: setup, then helper calls ``indices`` on their arguments
    (encoded plain data, decoded in the sandbox), results on fd 3."""
    calls = []
    for helper, (args, keywords) in zip((plan.helpers[i] for i in indices), arguments):
        data = json.dumps([args, keywords])
        calls.append(f"(lambda a: {helper.name}(*[__gyre_decode(x) for x in a[0]], "
                     f"**{{k: __gyre_decode(x) for k, x in a[1].items()}}))(__json_loads({data!r}))")
    return "\n".join([_ENCODE, _DECODE, "from json import loads as __json_loads", setup,
                      f"__gyre_emit(3, {_lambdas(calls)})"])


def isolated_program(test: str, setup: str, code: str) -> tuple[str, str]:
    """A test the parent cannot split, for an isolated run (``run_python(isolate=True)``, ``boot.isolated``):
    (the run's source, its stdin). The program runs in one process, the test in another with the program's
    names as proxies; the test's text goes on stdin, which only the test's process reads (after the fork),
    so the program's process never holds it (its expected values)."""
    payload = json.dumps({"codec": _ENCODE + _DECODE, "program": "\n".join([setup, "__name__ = 'solution'", code]),
                          "names": program_names(test, setup, code)})
    return payload, "\n".join([setup, test])


def program_names(test: str, setup: str, code: str) -> list[str]:
    """The names the test (or setup) reads but neither binds: the program's, proxied in the test's process.
    A builtin's name only where the program binds it (an entry point may shadow one)."""
    nodes = [n for source in (setup, test) for n in ast.walk(ast.parse(source))]
    loaded = {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    bound = {n.id for n in nodes if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    bound |= {n.arg for n in nodes if isinstance(n, ast.arg)}
    bound |= {n.name for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                                      ast.ExceptHandler)) and n.name}
    bound |= {(a.asname or a.name).split(".")[0] for n in nodes if isinstance(n, (ast.Import, ast.ImportFrom))
              for a in n.names}
    try:
        program = bound_names(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        program = set()  # the program will not run either
    return sorted(n for n in loaded - bound if n in program or not hasattr(builtins, n))
