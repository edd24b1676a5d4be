"""Arithmetic a small model cannot do in its head, with a Python tool that can.

Each seed draws an expression over a few 2-4 digit numbers; the answer goes in ``\\boxed{}``.
Rewards: 1 for the right integer, 0 for a wrong one, ``FORMAT_PENALTY`` for a turn with neither an
answer nor a tool call. ``PythonMath`` is the task wrapped with the sandboxed Python tool
(``gyre.envs.tools``); ``MathQuestion`` is the task alone.
"""

from __future__ import annotations

import random

from gyre.envs.builtin import FORMAT_PENALTY, boxed
from gyre.envs.tools import PythonTool, ToolEnv, ToolFormat


class MathQuestion:
    def __init__(self, terms: int = 3, digits: int = 3):
        self.terms, self.digits = terms, digits
        self.answer = 0

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        rng = random.Random(seed)
        numbers = [rng.randint(10 ** (self.digits - 1), 10 ** self.digits - 1) for _ in range(self.terms)]
        ops = [rng.choice("+-*") for _ in numbers[1:]]
        self.answer = evaluate(numbers, ops)
        expr = " ".join([str(numbers[0]), *(f"{op} {n}" for op, n in zip(ops, numbers[1:]))])
        return f"What is {expr}? Give the answer like \\boxed{{42}}.", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        text = boxed(action)
        if text is None:
            return "No answer in \\boxed{}.", FORMAT_PENALTY, True, False, {"format_error": True}
        try:
            right = int(text.replace(",", "")) == self.answer
        except ValueError:
            right = False
        return ("Correct." if right else "Wrong."), float(right), True, False, {"success": right}


def evaluate(numbers: list[int], ops: list[str]) -> int:
    """``numbers[0] ops[0] numbers[1] ...`` with * before + and -."""
    terms, signs = [numbers[0]], []
    for op, n in zip(ops, numbers[1:]):
        if op == "*":
            terms[-1] *= n
        else:
            terms.append(n)
            signs.append(1 if op == "+" else -1)
    return terms[0] + sum(s * t for s, t in zip(signs, terms[1:]))


class PythonMath(ToolEnv):
    def __init__(self, terms: int = 3, digits: int = 3, tool_format: ToolFormat = "tags", max_tool_calls: int = 2,
                 timeout_s: float = 5.0, allow_weak: bool = False):
        super().__init__(MathQuestion(terms, digits), [PythonTool(timeout_s, allow_weak=allow_weak)], tool_format,
                         max_tool_calls)
