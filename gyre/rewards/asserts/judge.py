"""The parent side: decode the values the sandbox sent, evaluate each planned assert over plain data."""

from __future__ import annotations

import ast
import decimal
import fractions
import json

from gyre.rewards.asserts.plan import CONSTANT_NAMES, MATH, PURE_FUNCTIONS, AssertPlan

_HUGE_BITS = 1 << 20
"""Largest number (in bits) or sequence the parent builds from program data: 2 ** 10 ** 9 would stall it."""


class LeafError(Exception):
    """A leaf raised in the sandbox, or its value could not be sent; using it fails the assert."""


def decode(value: list):
    """Plain data from its encoded form. Self-contained (its source is also the sandbox's decoder in
    the helper run, see ``harness.py``)."""
    import decimal
    import fractions

    kind = value[0]
    if kind == "n":
        return None
    simple = {"b": lambda v: bool(v[1]), "i": lambda v: int(v[1], 16), "f": lambda v: float.fromhex(v[1]),
              "c": lambda v: complex(float.fromhex(v[1]), float.fromhex(v[2])), "s": lambda v: str(v[1]),
              "y": lambda v: bytes.fromhex(v[1]), "q": lambda v: fractions.Fraction(int(v[1], 16), int(v[2], 16)),
              "D": lambda v: decimal.Decimal(v[1])}
    if kind in simple:
        return simple[kind](value)
    if kind == "d":
        return {decode(k): decode(v) for k, v in value[1]}
    containers = {"l": list, "t": tuple, "S": set, "F": frozenset}
    if kind in containers:
        return containers[kind](decode(v) for v in value[1])
    raise ValueError(f"unknown value kind {kind!r}")


def encode(value, depth: int = 0) -> list:
    """Plain data as the sandbox encodes it (to hand the program's values to a helper run)."""
    if depth > 60:
        raise ValueError("value nested too deeply")
    if value is None:
        return ["n"]
    scalars = ((bool, lambda v: ["b", v]), (int, lambda v: ["i", hex(v)]), (float, lambda v: ["f", v.hex()]),
               (complex, lambda v: ["c", v.real.hex(), v.imag.hex()]), (str, lambda v: ["s", v]),
               (bytes, lambda v: ["y", v.hex()]), (fractions.Fraction, lambda v: ["q", hex(v.numerator),
                                                                               hex(v.denominator)]),
               (decimal.Decimal, lambda v: ["D", str(v)]))
    for kind, make in scalars:
        if type(value) is kind:
            return make(value)
    if type(value) is dict:
        return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]
    for tag, kind in (("l", list), ("t", tuple), ("S", set), ("F", frozenset)):
        if type(value) is kind:
            return [tag, [encode(v, depth + 1) for v in value]]
    raise TypeError(f"a {type(value).__name__} cannot be passed to a helper")


def decode_channel(raw: bytes, expected: int) -> list:
    """Leaf values (or LeafError) from one channel; missing or garbled output fails every leaf."""
    try:
        records = json.loads(raw.decode("utf-8"))
        if not isinstance(records, list) or len(records) != expected:
            raise ValueError(f"{len(records) if isinstance(records, list) else 'no'} values for {expected} leaves")
        return [LeafError(r["e"]) if "e" in r else decode(r["v"]) for r in records]
    except Exception as exc:  # noqa: BLE001 - anything the program wrote that does not decode fails its leaves
        missing = "the program ended before its results were sent" if not raw else f"unreadable results ({exc})"
        return [LeafError(missing[:300])] * expected


def leaf_values(plan: AssertPlan, channels: list[bytes]) -> dict[str, object]:
    """The reference and program leaves' values (fd 3 and fd 4 of the test run)."""
    reference = decode_channel(channels[0], len(plan.reference))
    program = decode_channel(channels[1], len(plan.program))
    return {**{f"__ref_{i}": v for i, v in enumerate(reference)}, **{f"__out_{i}": v for i, v in enumerate(program)}}


def helper_arguments(plan: AssertPlan, values: dict[str, object]) -> list[tuple[list, dict] | LeafError]:
    """Each helper call's arguments, evaluated here and encoded for the helper run (or why they cannot be)."""
    evaluate = Evaluator(values, plan.constants)
    out: list = []
    for helper in plan.helpers:
        try:
            args = [encode(evaluate(a)) for a in helper.args]
            out.append((args, {k: encode(evaluate(v)) for k, v in helper.keywords.items()}))
        except Exception as exc:  # noqa: BLE001 - a program value that raised or is not plain data
            out.append(LeafError(f"{type(exc).__name__}: {str(exc)[:200]}"))
    return out


def _bounded(op: type, a, b) -> None:
    """Refuse results the reward process should never build from program data."""
    def bits(x) -> int:
        return x.bit_length() if isinstance(x, int) else 64
    if op is ast.Pow and isinstance(b, int) and abs(b) > 1 and bits(a) * abs(b) > _HUGE_BITS and a not in (0, 1, -1):
        raise ValueError("result too large to compare")
    if op is ast.LShift and isinstance(b, int) and b > _HUGE_BITS:
        raise ValueError("result too large to compare")
    if op is ast.Mult:
        for seq, n in ((a, b), (b, a)):
            if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int) and len(seq) * n > _HUGE_BITS:
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

    def __init__(self, leaves: dict[str, object], constants: dict[str, object]):
        self.leaves, self.constants = leaves, constants

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
        if node.id in self.constants:
            return self.constants[node.id]
        return CONSTANT_NAMES[node.id] if node.id in CONSTANT_NAMES else PURE_FUNCTIONS[node.id]

    def eval_Attribute(self, node):
        return MATH[node.attr]  # the planner keeps only math.<name>

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


def judge(plan: AssertPlan, values: dict[str, object]) -> tuple[bool, str]:
    """Whether every assert of ``plan`` holds over the leaf values; else a reason."""
    evaluate = Evaluator(values, plan.constants)
    for check, source in zip(plan.checks, plan.sources):
        try:
            holds = bool(evaluate(check))
        except Exception as exc:  # noqa: BLE001 - a leaf that raised, or a comparison of wrong types
            return False, f"{source}: {type(exc).__name__}: {str(exc)[:200]}"
        if not holds:
            return False, f"{source}: failed with {_describe(values, plan)}"[:300]
    return True, ""


def _describe(values: dict, plan: AssertPlan) -> str:
    parts = []
    for key, value in values.items():
        if key.startswith("__out_"):
            try:
                shown = repr(value)[:80]
            except Exception:  # noqa: BLE001 - e.g. an int too long to print
                shown = f"<{type(value).__name__}>"
            parts.append(f"{plan.program[int(key[6:])][:60]} = {shown}")
    return ", ".join(parts) or "no program values"
