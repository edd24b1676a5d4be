"""The parent side: decode the values the sandbox sent, evaluate each planned assert over plain data."""

from __future__ import annotations

import ast
import decimal
import fractions
import json

from gyre.rewards.asserts.plan import CONSTANT_NAMES, MATH, PURE_FUNCTIONS, AssertPlan

_HUGE_BITS = 1 << 20
"""Largest number (in bits) or sequence the parent builds from program data: 2 ** 10 ** 9 would stall it."""
_MAX_NODES = 250_000
"""Values decoded from one channel, all nested values counted (a 1 MB channel holds ~100,000)."""
_MAX_CHANNEL_BYTES = 1 << 24
_FRACTION_BITS = 1 << 14
"""Largest Fraction part the parent computes with: Fraction arithmetic runs a gcd, quadratic in size."""


class LeafError(Exception):
    """A leaf raised in the sandbox, or its value could not be sent; using it fails the assert."""


def decode(value: list, budget: list | None = None, depth: int = 0):
    """Plain data from its encoded form. Self-contained (its source is also the sandbox's decoder in
    the helper and isolated runs, see ``harness.py``).

    The program chose this data, so everything that would cost the decoder, or a later comparison,
    unbounded time is refused (ValueError): more than ``budget[0]`` nodes in all, nesting deeper than
    the encoder allows, integers longer than 2**17 bits (Fraction parts 2**14: their gcd is quadratic),
    Decimals with huge exponents or digit strings, and sets or dict keys whose elements share one hash
    (``i * (2**61 - 1)`` all hash alike: building a set of 30,000 such ints takes seconds).
    """
    import decimal
    import fractions

    if budget is None:
        budget = [250_000]  # nodes in one call: one channel, or one argument of a helper call
    budget[0] -= 1
    if budget[0] < 0 or depth > 64:
        raise ValueError("value too large or nested too deeply to compare")

    def text(v, most, what):
        if not isinstance(v, str) or len(v) > most:
            raise ValueError(f"{what} too large to compare")
        return v

    def one_hash_each(items):
        counts = {}
        for item in items:
            key = hash(item)  # linear; TypeError for an unhashable element, as the real set() would raise
            counts[key] = counts.get(key, 0) + 1
            if counts[key] > 8:
                raise ValueError("too many set elements or dict keys share one hash value to compare")
        return items

    def make_decimal(v):
        d = decimal.Decimal(text(v, 4200, "a Decimal"))
        if d.is_finite() and not -10_000 <= d.adjusted() <= 10_000:
            raise ValueError("a Decimal exponent too large to compare")
        return d

    kind = value[0]
    if kind == "n":
        return None
    real = lambda v: float.fromhex(text(v, 64, "a float"))  # noqa: E731
    simple = {"b": lambda v: bool(v[1]), "i": lambda v: int(text(v[1], 1 << 15, "an integer"), 16),
              "f": lambda v: real(v[1]), "c": lambda v: complex(real(v[1]), real(v[2])),
              "s": lambda v: str(v[1]), "y": lambda v: bytes.fromhex(v[1]),
              "q": lambda v: fractions.Fraction(int(text(v[1], 1 << 12, "a Fraction"), 16),
                                                int(text(v[2], 1 << 12, "a Fraction"), 16)),
              "D": lambda v: make_decimal(v[1])}
    if kind in simple:
        return simple[kind](value)
    if kind == "d":
        pairs = [(decode(k, budget, depth + 1), decode(v, budget, depth + 1)) for k, v in value[1]]
        one_hash_each([k for k, _ in pairs])
        return dict(pairs)
    containers = {"l": list, "t": tuple, "S": set, "F": frozenset}
    if kind in containers:
        items = [decode(v, budget, depth + 1) for v in value[1]]
        return containers[kind](one_hash_each(items) if kind in "SF" else items)
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
    """Leaf values (or LeafError) from one channel; missing or garbled output fails every leaf, a value
    too costly to rebuild fails its own leaf. All of a channel's values share one node budget."""
    try:
        if len(raw) > _MAX_CHANNEL_BYTES:  # the sandbox caps its output; a remote one is not trusted to
            raise ValueError(f"more than {_MAX_CHANNEL_BYTES} bytes")
        records = json.loads(raw.decode("utf-8"))
        if not isinstance(records, list) or len(records) != expected:
            raise ValueError(f"{len(records) if isinstance(records, list) else 'no'} values for {expected} leaves")
    except Exception as exc:  # noqa: BLE001 - anything the program wrote that does not decode fails its leaves
        missing = "the program ended before its results were sent" if not raw else f"unreadable results ({exc})"
        return [LeafError(missing[:300])] * expected
    budget = [_MAX_NODES]
    out: list = []
    for record in records:
        try:
            if "e" in record:
                out.append(LeafError(str(record["e"])[:300] if isinstance(record["e"], str) else "an error"))
            else:
                out.append(decode(record["v"], budget))
        except Exception as exc:  # noqa: BLE001 - e.g. a forged record, or a value refused as too costly
            out.append(LeafError(f"unreadable result ({type(exc).__name__}: {str(exc)[:200]})"))
    return out


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


def _bits(x) -> int:
    if isinstance(x, fractions.Fraction):
        return max(x.numerator.bit_length(), x.denominator.bit_length())
    return x.bit_length() if isinstance(x, int) else 64


def _bounded(op: type, a, b) -> None:
    """Refuse results the reward process should never build from program data (each check is linear)."""
    if op is ast.Pow and isinstance(b, int) and abs(b) > 1 and _bits(a) * abs(b) > _HUGE_BITS and a not in (0, 1, -1):
        raise ValueError("result too large to compare")
    if op is ast.LShift and isinstance(b, int) and b > _HUGE_BITS:
        raise ValueError("result too large to compare")
    if op is ast.Mod and isinstance(a, (str, bytes)) and _wide_format(a):  # "%02000000000d" % 1: gigabytes
        raise ValueError("%-formatting with a huge width or precision is not evaluated outside the sandbox")
    if op in (ast.Mult, ast.Add):
        for seq, n in ((a, b), (b, a)):
            if not isinstance(seq, (str, bytes, list, tuple)):
                continue
            size = len(seq) * n if isinstance(n, int) else len(seq) + len(n) if isinstance(n, type(seq)) else 0
            if size > _HUGE_BITS:
                raise ValueError("sequence too large to compare")
    if isinstance(a, int) and isinstance(b, int) and op is ast.Mult and _bits(a) + _bits(b) > _HUGE_BITS:
        raise ValueError("result too large to compare")
    if isinstance(a, int) and isinstance(b, int) and op in (ast.FloorDiv, ast.Mod):
        if _bits(b) * max(0, _bits(a) - _bits(b)) > 1 << 36:  # long division is quadratic
            raise ValueError("division too large to compute")
    numbers = (a, b)
    if any(isinstance(x, fractions.Fraction) for x in numbers) and max(map(_bits, numbers)) > _FRACTION_BITS:
        raise ValueError("Fraction too large to compute with")  # every Fraction operation runs a gcd
    if any(isinstance(x, decimal.Decimal) for x in numbers) and max(map(_bits, numbers)) > 1 << 17:
        raise ValueError("integer too large to convert to a Decimal")


def _wide_format(text) -> bool:
    """Whether a %-format asks for a width or precision over 10,000 characters (or one given by ``*``)."""
    import re

    pattern = r"%[-+ #0]*(\*|\d*)(?:\.(\*|\d*))?"
    spec = re.compile(pattern.encode() if isinstance(text, bytes) else pattern)
    for match in spec.finditer(text):
        for part in match.groups():
            if part and (part in ("*", b"*") or int(part) > 10_000):
                return True
    return False


def _bounded_call(fn, args: list, keywords: dict):
    """Call a pure builtin on program data, refusing the calls whose cost the data alone decides:
    ``range``/``bytes`` of a huge size (then summed or sorted), ``sum`` of lists (quadratic),
    ``round`` to huge precision, ``set``/``dict`` of elements sharing one hash, ``int`` of a long string."""
    if fn is range and len(args) <= 3 and all(isinstance(a, int) for a in args):
        if _bits(max(map(abs, args), default=0)) > 62 or len(range(*args)) > _HUGE_BITS:
            raise ValueError("range too large to compare")
    if fn is bytes and args and isinstance(args[0], int) and args[0] > _HUGE_BITS:
        raise ValueError("bytes too large to compare")
    if fn is round and len(args) > 1 and isinstance(args[1], int) and abs(args[1]) > 10_000:
        raise ValueError("rounding precision too large")
    if fn in (int, float, complex) and args and isinstance(args[0], (str, bytes)) and len(args[0]) > 4300:
        raise ValueError("number too long to convert")
    if fn in (str, repr) and args and isinstance(args[0], int) and _bits(args[0]) > 14_000:
        raise ValueError("integer too long to convert to a string")  # quadratic before Python 3.11's limit
    if fn is divmod and len(args) == 2:
        _bounded(ast.FloorDiv, *args)
    if fn is sum and args:
        items, total = list(args[0]), args[1] if len(args) > 1 else keywords.get("start", 0)
        growing = (fractions.Fraction, list, tuple)  # a Fraction's parts grow with every term, lists copy
        if any(isinstance(x, growing) for x in [total, *items]):
            copied = 0
            for item in items:
                _bounded(ast.Add, total, item)
                copied += len(total) if isinstance(total, (list, tuple)) else 0
                if copied > 1 << 24:
                    raise ValueError("sum of sequences too large to compute")
                total = total + item
            return total
        return sum(items, total)
    if fn in (set, frozenset, dict) and args:
        items = list(args[0].items() if isinstance(args[0], dict) else args[0])
        _one_hash_each([i[0] if fn is dict and isinstance(i, (tuple, list)) and i else i for i in items])
        return fn(items, **keywords)
    return fn(*args, **keywords)


def _one_hash_each(items) -> None:
    counts: dict[int, int] = {}
    for item in items:
        key = hash(item)
        counts[key] = counts.get(key, 0) + 1
        if counts[key] > 8:
            raise ValueError("too many set elements or dict keys share one hash value to compare")


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
        return _bounded_call(fn, [self(a) for a in node.args], {k.arg: self(k.value) for k in node.keywords})

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
            _bounded(ast.Eq, left, right)  # a huge int compared with a Decimal is converted first
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
        return _bounded_call(set, [[self(e) for e in node.elts]], {})

    def eval_Dict(self, node):
        return _bounded_call(dict, [[(self(k), self(v)) for k, v in zip(node.keys, node.values)]], {})


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


def isolated_verdict(raw: bytes) -> tuple[bool, str]:
    """The verdict an isolated test's process wrote (``boot.judge``): passed, else why."""
    try:
        verdict = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")]) if len(raw) < 1 << 16 else None
    except ValueError:
        verdict = None
    if not isinstance(verdict, dict):
        return False, "the test's process wrote no verdict"
    return verdict.get("passed") is True, str(verdict.get("why", ""))[:300]
