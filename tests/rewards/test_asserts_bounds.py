"""The parent's cost of decoding and comparing the sandbox's results is bounded (issue 25): values that
would cost it seconds are refused with a reason, failing their test, instead of being rebuilt."""

from __future__ import annotations

import json
from decimal import Decimal
from fractions import Fraction

import pytest

from gyre.rewards import asserts
from gyre.rewards.asserts.judge import LeafError, decode, decode_channel, encode
from gyre.rewards.code import code_reward

MODULUS = 2**61 - 1
"""Python's int hash is modulo this: all multiples of it hash to 0."""
COLLIDING = [["i", hex(i * MODULUS)] for i in range(30_000)]


def channel(*values) -> bytes:
    return json.dumps([{"v": v} for v in values]).encode()


@pytest.mark.parametrize("value, reason", [
    (["S", COLLIDING], "share one hash"),
    (["F", COLLIDING], "share one hash"),
    (["d", [[k, ["n"]] for k in COLLIDING]], "share one hash"),
    (["l", [["t", [k]] for k in COLLIDING[:20]] + [["S", [["t", [k]] for k in COLLIDING[:20]]]]], "share one hash"),
    (["q", hex(3**200_000), hex(7**150_000)], "Fraction too large"),
    (["D", "1e999999999"], "Decimal exponent too large"),
    (["D", "1" * 100_000], "Decimal too large"),
    (["i", hex(3**500_000)], "integer too large"),
    (["f", "0x1." + "0" * 10_000 + "p0"], "float too large"),
    (["l", [["n"]] * 300_000], "too large or nested too deeply"),
    (["l", []], None),
], ids=["set", "frozenset", "dict-keys", "nested-tuples", "fraction", "decimal-exponent", "decimal-digits", "int",
        "float", "node-budget", "empty"])
def test_costly_values_are_refused_with_a_reason(value, reason):
    result = decode_channel(channel(value), 1)[0]
    if reason is None:
        assert result == []
    else:
        assert isinstance(result, LeafError) and reason in str(result), result


def test_deep_nesting_is_refused_and_other_leaves_still_decode():
    deep: list = ["n"]
    for _ in range(100):
        deep = ["l", [deep]]
    values = decode_channel(channel(deep, ["S", [["i", "0x1"], ["i", "0x2"]]]), 2)
    assert isinstance(values[0], LeafError) and "nested too deeply" in str(values[0])
    assert values[1] == {1, 2}


def test_plain_values_round_trip_within_the_bounds():
    value = {"a": [1, 2.5, (3, "x")], (1, 2): {frozenset({1}), None}, "q": Fraction(2, 3), "d": Decimal("1.25"),
             "big": 3**10_000, "neg": -(2**100), "c": 1 + 2j, "b": b"\x00"}
    assert decode(encode(value)) == value
    assert decode(["S", [["i", hex(i)] for i in (-1, -2)]]) == {-1, -2}  # a real hash coincidence is fine


def test_a_forged_error_record_stays_short():
    values = decode_channel(json.dumps([{"e": ["x"] * 1000}, {"e": "E: " + "y" * 10_000}]).encode(), 2)
    assert all(isinstance(v, LeafError) and len(str(v)) <= 300 for v in values)


@pytest.mark.parametrize("test, value, reason", [
    ("assert sum(range(0, f(1))) == 0", 10**18, "range too large"),
    ("assert max(range(0, f(1), 1)) == 0", 2**70, "range too large"),
    ("assert bytes(f(1) + 0) == b''", 10**12, "bytes too large"),
    ("assert set(f(1) + []) == set()", [i * MODULUS for i in range(30_000)], "share one hash"),
    ("assert {f(1)[0], f(1)[1]} != set() and dict(zip(f(1) + [], f(1))) == {}", [i * MODULUS for i in range(30_000)],
     "share one hash"),
    ("assert divmod(f(1) + 0, f(1) // 3**300_000) == (0, 0)", 3**600_000, "division too large"),
    ("assert (f(1) + 0) % (f(1) // 3**300_000) == 0", 3**600_000, "division too large"),
    ("assert sum(f(1), []) == []", [[0] * 1000] * 1000, "sum of sequences too large"),
    ("assert sum(f(1), 0) == 0", [Fraction(1, p) for p in range(2, 20_000)], "Fraction too large"),
    ("assert round(f(1) + 0, -10**6) == 0", 5, "rounding precision too large"),
    ("assert int(f(1) + '') == 0", "9" * 100_000, "number too long"),
    ("assert f(1) * f(1) == 0", 3**400_000, "result too large"),
    ("assert 'x' * f(1) == 'xx'", 10**9, "sequence too large"),
    ("assert f(1) % 7 == '3'", "%02000000000d", "%-formatting with a huge width"),
], ids=["sum-range", "max-range", "bytes", "set-call", "dict-call", "divmod", "mod", "sum-lists", "sum-fractions",
        "round", "int-of-str", "int-mult", "str-repeat", "percent-format"])
def test_the_parent_refuses_costly_operations_on_program_values(test, value, reason):
    plan = asserts.plan_test(test, "")
    assert not plan.reference
    values = {f"__out_{i}": value for i in range(len(plan.program))}
    passed, why = asserts.judge(plan, values)
    assert not passed and reason in why, why


def test_a_colliding_set_fails_its_test_and_the_reward_goes_on():
    gt = json.dumps({"asserts": ["assert f(1) == {0}", "assert g(1) == 2"]})
    code = "def f(x):\n    return {i * (2**61 - 1) for i in range(3000)}\ndef g(x):\n    return 2"
    result = code_reward(f"```python\n{code}\n```", gt, partial_credit=True, timeout_s=5.0)
    assert result.status == "ok" and result.info["statuses"] == ["wrong", "pass"], result.info
    assert "share one hash" in result.info["detail"]
