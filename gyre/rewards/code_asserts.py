"""Assert-style code tests, compared outside the sandbox.

Run inside the sandbox, ``assert solve(2) == 4`` can be gamed: ``solve`` may return an object whose
``__eq__`` always holds, rebind a builtin the assert uses, or read the expected value from the test's
own source and return it. So an assert is split where it is evaluated:

- the **parent** (the reward process) evaluates the assert's structure: comparisons, boolean logic,
  arithmetic, subscripts, literals and a fixed set of pure builtins (``len``, ``sorted``, ``abs``,
  ``math.isclose``...), over plain data;
- the **sandbox** evaluates only the leaves the parent cannot: calls into the program or the test's
  setup, and names bound there. Each leaf's value is serialised (plain data only: numbers, strings,
  bytes, None and containers of them; an object of any other type fails the test) and sent back on a
  data channel.

Expected values (the literals of the assert outside the program's calls) never enter the sandbox, so
a program can only pass by producing the right data. Leaves that use only names the setup binds (a
reference implementation, say) are evaluated after the setup and before the program runs, and their
channel is closed before the program's first line: the program cannot change them.

Tests the planner cannot split (a comparison inside a comprehension, statements other than asserts,
``check(candidate)`` bodies with more than asserts) run whole in the sandbox as before and are
counted (``info["unsplit"]``); ``gyre check`` warns about them.
"""

from __future__ import annotations

import ast
import builtins
import copy
import fractions
import json
import math
from dataclasses import dataclass, field

_PURE_FUNCTIONS = {name: getattr(builtins, name) for name in (
    "abs", "all", "any", "bool", "bytes", "complex", "dict", "divmod", "enumerate", "float", "frozenset", "int",
    "isinstance", "len", "list", "max", "min", "range", "repr", "reversed", "round", "set", "sorted", "str",
    "sum", "tuple", "type", "zip")}
_MATH = {name: getattr(math, name) for name in (
    "isclose", "sqrt", "floor", "ceil", "fabs", "isnan", "isinf", "isfinite", "log", "exp", "pi", "e", "inf", "nan")}
_CONSTANT_NAMES = {"True": True, "False": False, "None": None}
_PARENT_NODES = (ast.Compare, ast.BoolOp, ast.UnaryOp, ast.BinOp, ast.IfExp, ast.Subscript, ast.Slice, ast.Tuple,
                 ast.List, ast.Set, ast.Dict, ast.Constant)
_DECISIONS = (ast.Compare, ast.BoolOp, ast.IfExp)
_DECIDING = {"all", "any", "bool", "isinstance", "isclose", "isnan", "isinf", "isfinite", "type"}
"""Calls that decide (their result is a verdict): always evaluated in the parent."""
_HUGE = 1 << 16
"""Largest exponent or shift, and repeat count of a sequence, the parent computes (program data could
otherwise make it build a number or list of any size)."""


class Unsplittable(ValueError):
    """The test cannot be evaluated outside the sandbox; it runs whole inside."""


@dataclass
class AssertPlan:
    """One test: its asserts with leaves replaced by ``__leaf_<i>`` names, and the leaves' sources."""

    checks: list[ast.expr]
    reference: list[str] = field(default_factory=list)
    """Leaves evaluated after the setup, before the program (names the setup binds only)."""
    program: list[str] = field(default_factory=list)
    """Leaves evaluated after the program ran."""
    sources: list[str] = field(default_factory=list)
    """Each assert's own source, for failure messages."""


def bound_names(source: str) -> set[str]:
    """Names a module's top level binds (imports, defs, classes, assignments)."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def _asserts_of(test: str) -> list[ast.Assert]:
    """The asserts of a test: top-level ``assert`` statements, or a ``def check(candidate)`` of asserts
    followed by ``check(entry_point)`` (HumanEval's form), with ``candidate`` renamed."""
    body = ast.parse(test).body
    if body and all(isinstance(s, ast.Assert) for s in body):
        return body  # type: ignore[return-value]
    defs = [s for s in body if isinstance(s, ast.FunctionDef)]
    calls = [s for s in body if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)]
    if len(defs) == 1 and len(calls) == 1 and len(body) == 2 and len(defs[0].args.args) == 1:
        fn, call = defs[0], calls[0].value
        stmts = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        if (isinstance(call.func, ast.Name) and call.func.id == fn.name and len(call.args) == 1
                and isinstance(call.args[0], ast.Name) and stmts and all(isinstance(s, ast.Assert) for s in stmts)):
            param, entry = fn.args.args[0].arg, call.args[0].id
            renamed = [_Rename(param, entry).visit(s) for s in stmts]
            return [ast.fix_missing_locations(s) for s in renamed]
    raise Unsplittable("the test is not a sequence of asserts")


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.copy_location(ast.Name(self.new, node.ctx), node) if node.id == self.old else node


def _free_names(node: ast.AST) -> set[str]:
    bound = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    bound |= {a.arg for n in ast.walk(node) if isinstance(n, ast.Lambda) for a in n.args.args}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - bound


def _is_math(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "math"
            and node.attr in _MATH)


class _Planner:
    """Replaces every subtree the parent cannot evaluate with a leaf name (see ``plan_test``)."""

    def __init__(self, setup_names: set[str], program_names: set[str]):
        self.setup_names = setup_names
        self.pure = {n for n in _PURE_FUNCTIONS if n not in setup_names | program_names}
        """Builtins the parent may call: those neither the setup nor the program rebinds."""
        self.reference_names = setup_names | (set(dir(builtins)) - program_names)
        self.plan = AssertPlan([])

    def leaf(self, node: ast.expr) -> ast.Name:
        if any(isinstance(n, _DECISIONS) for n in ast.walk(node)):
            raise Unsplittable("a comparison inside an expression the sandbox must evaluate")
        source = ast.unparse(node)
        if _free_names(node) <= self.reference_names:
            self.plan.reference.append(source)
            return ast.Name(f"__ref_{len(self.plan.reference) - 1}", ast.Load())
        self.plan.program.append(source)
        return ast.Name(f"__out_{len(self.plan.program) - 1}", ast.Load())

    def visit(self, node: ast.expr) -> ast.expr:
        if isinstance(node, ast.Name):
            return node if node.id in _CONSTANT_NAMES or node.id in self.pure else self.leaf(node)
        if _is_math(node):
            return node
        if isinstance(node, ast.Call):
            return self._call(node)
        displays = (ast.Tuple, ast.List, ast.Set)
        starred = isinstance(node, displays) and any(isinstance(e, ast.Starred) for e in node.elts)
        if isinstance(node, _PARENT_NODES) and not starred and not (isinstance(node, ast.Dict) and None in node.keys):
            for name, value in ast.iter_fields(node):
                if isinstance(value, ast.expr):
                    setattr(node, name, self.visit(value))
                elif isinstance(value, list):
                    setattr(node, name, [self.visit(v) if isinstance(v, ast.expr) else v for v in value])
            return node
        return self.leaf(node)

    def _call(self, node: ast.Call) -> ast.expr:
        name = node.func.id if isinstance(node.func, ast.Name) else None
        pure = name in self.pure or _is_math(node.func)
        if not pure or any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            return self.leaf(node)
        original = copy.deepcopy(node)
        marks = len(self.plan.reference), len(self.plan.program)
        node.args = [self.visit(a) for a in node.args]
        node.keywords = [ast.keyword(k.arg, self.visit(k.value)) for k in node.keywords]
        planned = [*node.args, *(k.value for k in node.keywords)]
        leaves = [a for a in planned if isinstance(a, ast.Name) and a.id.startswith(("__ref_", "__out_"))]
        if planned and len(leaves) == len(planned) and name not in _DECIDING:
            # e.g. list(f(x)) or sorted(f(x), key=len): no expected value inside, nothing decided;
            # materialise it in the sandbox (f may return an iterator)
            del self.plan.reference[marks[0]:], self.plan.program[marks[1]:]
            return self.leaf(original)
        return node


def plan_test(test: str, setup: str, code: str) -> AssertPlan:
    """Split ``test`` for the program ``code`` (see the module docstring); raises ``Unsplittable``."""
    try:
        asserts = _asserts_of(test)
        setup_names = bound_names(setup) if setup.strip() else set()
    except SyntaxError as exc:
        raise Unsplittable(str(exc)) from None
    try:
        program_names = bound_names(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        program_names = set()  # it will fail to run anyway
    planner = _Planner(setup_names, program_names)
    for statement in asserts:
        planner.plan.sources.append(ast.unparse(statement))
        planner.plan.checks.append(planner.visit(statement.test))
    return planner.plan


# ---- the sandbox side: evaluate leaves, serialise plain data --------------------------------------------

_HARNESS = '''
def __gyre_encode(v, depth=0):
    if depth > 60:
        raise ValueError("value nested too deeply")
    for kind, types in (("b", (bool,)), ("i", (int,)), ("f", (float,)), ("c", (complex,)), ("s", (str,)),
                        ("y", (bytes, bytearray))):
        if isinstance(v, types):
            break
    else:
        kind = None
    if v is None:
        return ["n"]
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
    name = type(v).__name__
    if name == "Fraction":
        return ["q", hex(v.numerator), hex(v.denominator)]
    if name == "Decimal":
        return ["D", str(v)]
    if isinstance(v, dict):
        return ["d", [[__gyre_encode(k, depth + 1), __gyre_encode(x, depth + 1)] for k, x in v.items()]]
    for kind, types in (("l", list), ("t", tuple), ("S", set), ("F", frozenset)):
        if isinstance(v, types):
            return [kind, [__gyre_encode(x, depth + 1) for x in v]]
    raise TypeError(f"a {name} cannot be compared outside the sandbox; return plain data")


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


def harness_program(plan: AssertPlan, setup: str, code: str) -> str:
    """The sandboxed program: setup, reference leaves (fd 3, closed), the response's code, program
    leaves (fd 4)."""
    lambdas = lambda sources: "[" + ", ".join(f"lambda: ({s})" for s in sources) + "]"
    return "\n".join([_HARNESS, setup, f"__gyre_emit(3, {lambdas(plan.reference)})", "__name__ = 'solution'", code,
                      "__name__ = '__main__'", f"__gyre_emit(4, {lambdas(plan.program)})"])


# ---- the parent side: decode, evaluate the structure ----------------------------------------------------


class LeafError(Exception):
    """A leaf raised in the sandbox, or its value could not be sent; using it fails the assert."""


def decode(value: list):
    kind = value[0]
    if kind == "n":
        return None
    simple = {"b": lambda v: bool(v[1]), "i": lambda v: int(v[1], 16), "f": lambda v: float.fromhex(v[1]),
              "c": lambda v: complex(float.fromhex(v[1]), float.fromhex(v[2])), "s": lambda v: str(v[1]),
              "y": lambda v: bytes.fromhex(v[1]), "q": lambda v: fractions.Fraction(int(v[1], 16), int(v[2], 16))}
    if kind in simple:
        return simple[kind](value)
    if kind == "D":
        import decimal

        return decimal.Decimal(value[1])
    if kind == "d":
        return {decode(k): decode(v) for k, v in value[1]}
    containers = {"l": list, "t": tuple, "S": set, "F": frozenset}
    if kind in containers:
        return containers[kind](decode(v) for v in value[1])
    raise ValueError(f"unknown value kind {kind!r}")


def decode_channel(raw: bytes, expected: int) -> list:
    """Leaf values (or LeafError) from one channel; missing or garbled output fails every leaf."""
    try:
        records = json.loads(raw.decode("utf-8"))
        if not isinstance(records, list) or len(records) != expected:
            raise ValueError(f"{len(records) if isinstance(records, list) else 'no'} values for {expected} leaves")
        return [LeafError(r["e"]) if "e" in r else decode(r["v"]) for r in records]
    except (ValueError, KeyError, TypeError, IndexError, RecursionError, UnicodeDecodeError, OverflowError) as exc:
        missing = "the program ended before its results were sent" if not raw else f"unreadable results ({exc})"
        return [LeafError(missing)] * expected


def _bounded(op, a, b):
    """Refuse results the reward process should never build: 2 ** (10 ** 9), [0] * 10 ** 12."""
    big = lambda x: isinstance(x, int) and abs(x) > _HUGE
    if op in (ast.Pow, ast.LShift) and big(b) and not (isinstance(a, (int, float)) and abs(a) <= 1):
        raise ValueError("result too large to compare")
    if op is ast.Mult and ((big(a) and isinstance(b, (str, bytes, list, tuple)))
                           or (big(b) and isinstance(a, (str, bytes, list, tuple)))):
        raise ValueError("sequence too large to compare")


_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
           ast.Pow: lambda a, b: a ** b, ast.BitAnd: lambda a, b: a & b, ast.BitOr: lambda a, b: a | b,
           ast.BitXor: lambda a, b: a ^ b, ast.LShift: lambda a, b: a << b, ast.RShift: lambda a, b: a >> b}
_CMPOPS = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b,
           ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
           ast.Is: lambda a, b: a is b, ast.IsNot: lambda a, b: a is not b, ast.In: lambda a, b: a in b,
           ast.NotIn: lambda a, b: a not in b}
_UNOPS = {ast.Not: lambda a: not a, ast.USub: lambda a: -a, ast.UAdd: lambda a: +a, ast.Invert: lambda a: ~a}


class Evaluator:
    """Evaluates a planned assert over plain data: only the node types the planner keeps, no ``eval``."""

    def __init__(self, leaves: dict[str, object]):
        self.leaves = leaves

    def __call__(self, node: ast.expr):
        method = getattr(self, f"eval_{type(node).__name__}", None)
        if method is None:
            raise ValueError(f"cannot evaluate {type(node).__name__}")
        return method(node)

    def eval_Constant(self, node):
        return node.value

    def eval_Name(self, node):
        if node.id in self.leaves:
            value = self.leaves[node.id]
            if isinstance(value, LeafError):
                raise value
            return value
        return _CONSTANT_NAMES[node.id] if node.id in _CONSTANT_NAMES else _PURE_FUNCTIONS[node.id]

    def eval_Attribute(self, node):
        return _MATH[node.attr]  # the planner keeps only math.<name>

    def eval_Call(self, node):
        fn = self(node.func)
        return fn(*(self(a) for a in node.args), **{k.arg: self(k.value) for k in node.keywords})

    def eval_BinOp(self, node):
        left, right = self(node.left), self(node.right)
        _bounded(type(node.op), left, right)
        return _BINOPS[type(node.op)](left, right)

    def eval_UnaryOp(self, node):
        return _UNOPS[type(node.op)](self(node.operand))

    def eval_BoolOp(self, node):
        value = None
        for operand in node.values:
            value = self(operand)
            if isinstance(node.op, ast.And) != bool(value):
                return value
        return value

    def eval_Compare(self, node):
        left = self(node.left)
        for op, comparator in zip(node.ops, node.comparators):
            right = self(comparator)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True

    def eval_IfExp(self, node):
        return self(node.body) if self(node.test) else self(node.orelse)

    def eval_Subscript(self, node):
        return self(node.value)[self(node.slice)]

    def eval_Slice(self, node):
        part = lambda n: None if n is None else self(n)
        return slice(part(node.lower), part(node.upper), part(node.step))

    def eval_Tuple(self, node):
        return tuple(self(e) for e in node.elts)

    def eval_List(self, node):
        return [self(e) for e in node.elts]

    def eval_Set(self, node):
        return {self(e) for e in node.elts}

    def eval_Dict(self, node):
        return {self(k): self(v) for k, v in zip(node.keys, node.values)}


def judge(plan: AssertPlan, channels: list[bytes]) -> tuple[bool, str]:
    """Whether every assert of ``plan`` holds over the leaf values the sandbox sent; else a reason."""
    values = {f"__ref_{i}": v for i, v in enumerate(decode_channel(channels[0], len(plan.reference)))}
    values.update({f"__out_{i}": v for i, v in enumerate(decode_channel(channels[1], len(plan.program)))})
    evaluate = Evaluator(values)
    for check, source in zip(plan.checks, plan.sources):
        try:
            holds = bool(evaluate(check))
        except Exception as exc:  # noqa: BLE001 - a leaf that raised, or a comparison of wrong types
            return False, f"{source}: {type(exc).__name__}: {str(exc)[:200]}"
        if not holds:
            shown = {k: v for k, v in values.items() if k.startswith("__out_")}
            return False, f"{source}: failed with {_describe(shown, plan)}"[:300]
    return True, ""


def _describe(values: dict, plan: AssertPlan) -> str:
    parts = [f"{plan.program[int(k[6:])]} = {v!r}"[:120] for k, v in values.items()]
    return ", ".join(parts) or "no program values"
