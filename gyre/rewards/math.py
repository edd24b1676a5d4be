"""Math answers checked with math-verify (integers, fractions, decimals, LaTeX, ``\\boxed{}``).

Plain integer answers, the common case in synthetic tasks, are compared directly: exact, and about
100x cheaper than a symbolic parse. math-verify's own signal-based timeouts are switched off (they
only work on a main thread); the reward runner enforces a wall-clock limit per sample instead.
"""

from __future__ import annotations

import logging
import re

from gyre.types import RewardResult

# math-verify warns on every call that its own timeouts are off; the runner's limit applies instead.
logging.getLogger("math_verify").setLevel(logging.ERROR)

_INT = re.compile(r"^[+-]?\d+$")


def _gold(ground_truth: str):
    from math_verify import parse

    parsed = parse(ground_truth, parsing_timeout=None)
    if not parsed and "$" not in ground_truth:
        parsed = parse(f"${ground_truth}$", parsing_timeout=None)
    return parsed


def math_reward(response: str, ground_truth: str) -> RewardResult:
    """1.0 when the response's final answer equals ``ground_truth`` mathematically, else 0.0."""
    answer, truth = response.strip(), ground_truth.strip()
    if _INT.match(truth) and _INT.match(answer):
        ok = int(answer) == int(truth)
        return RewardResult(score=float(ok), correct=ok)
    from math_verify import parse, verify

    gold = _gold(truth)
    if not gold:
        raise ValueError(f"ground truth {ground_truth!r} cannot be parsed as a math answer")
    pred = parse(response, parsing_timeout=None)
    ok = bool(pred) and verify(gold, pred, timeout_seconds=None)
    return RewardResult(score=float(ok), correct=ok)


def unparseable_ground_truths(records) -> list:
    """Records (with ``.ground_truth``) whose answer math-verify cannot read: every sample of such a
    prompt would score 0 for the whole run, so they are rejected when the data loads."""
    bad = []
    seen: dict[str, bool] = {}
    for record in records:
        truth = record.ground_truth.strip()
        if truth not in seen:
            seen[truth] = bool(_INT.match(truth)) or bool(_gold(truth))
        if not seen[truth]:
            bad.append(record)
    return bad
