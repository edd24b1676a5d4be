"""Math answers checked with math-verify (integers, fractions, decimals, LaTeX, ``\\boxed{}``).

What it checks: the response's final answer equals the ground truth mathematically (``\\frac{1}{2}`` ==
``0.5`` == ``1/2``); score 1.0 or 0.0.

Answer extraction comes first, so that math-verify only sees the answer and not every number in the
reasoning:

- ``answer_pattern`` (a regex with exactly one capturing group): the group of its LAST match. No match:
  score 0. ``boxed`` is then ignored.
- ``boxed="auto"`` (default): the content of the last complete ``\\boxed{...}`` if there is one, else the
  whole response (math-verify then picks its own final answer, e.g. "so x = 7" -> 7).
- ``boxed="always"``: only a complete ``\\boxed{...}`` counts; none: score 0.
- ``boxed="never"``: the whole response goes to math-verify.

``info["extracted"]`` is the extracted answer (for the whole-response modes, the text math-verify chose),
at most 500 characters; None when there is no answer.

Prior art: the ``\\boxed`` convention and last-box extraction of Hendrycks et al.'s MATH
(``last_boxed_only_string``, also in verl and DAPO) and Hugging Face math-verify, used by ROLL's math
rule reward. Deviations: braces are matched with a stack that skips escaped ``\\{``/``\\}``, so
``\\boxed{\\{1,2\\}}`` and nested ``\\frac`` work; an unclosed ``\\boxed{`` (a truncated answer) is not an
answer, and in "auto" a response whose only boxes are unclosed scores 0 instead of being searched whole.

Plain integer answers, the common case in synthetic tasks, are compared directly: exact, and about
100x cheaper than a symbolic parse. math-verify's own signal-based timeouts are switched off (they
only work on a main thread); the reward runner enforces a wall-clock limit per sample instead.
"""

from __future__ import annotations

import logging
import re
from collections import deque

from gyre.data.answers import last_boxed
from gyre.types import RewardResult

# math-verify warns on every call that its own timeouts are off; the runner's limit applies instead.
logging.getLogger("math_verify").setLevel(logging.ERROR)

_INT = re.compile(r"^[+-]?\d+$")
_BOX_OPEN = re.compile(r"\\boxed\s*\{")
_BOXED_MODES = ("auto", "always", "never")
_INFO_CHARS = 500


def _gold(ground_truth: str):
    from math_verify import parse

    parsed = parse(ground_truth, parsing_timeout=None)
    if not parsed and "$" not in ground_truth:
        parsed = parse(f"${ground_truth}$", parsing_timeout=None)
    return parsed


def _extract(response: str, answer_pattern: str | None, boxed: str) -> tuple[str | None, str | None]:
    """(the extracted answer, the text to hand math-verify); (None, None) when there is no answer, and
    (None, response) when the whole response is to be searched."""
    if answer_pattern is not None:
        regex = re.compile(answer_pattern)
        if regex.groups != 1:
            raise ValueError(f"answer_pattern {answer_pattern!r} must have exactly one capturing group, "
                             f"it has {regex.groups}")
        # Only the last match is wanted: a deque of one keeps it without a list of them all.
        last = next(iter(deque(regex.finditer(response), maxlen=1)), None)
        if last is None or last.group(1) is None:
            return None, None
        answer = last.group(1).strip()
        return answer, answer
    if boxed not in _BOXED_MODES:
        raise ValueError(f"boxed must be one of {', '.join(_BOXED_MODES)}, got {boxed!r}")
    if boxed == "never":
        return None, response
    content = last_boxed(response)
    if content is not None:
        # Re-boxed so that math-verify reads it as the final answer ("(1, 2)" is an interval, not 2).
        return content.strip(), f"\\boxed{{{content}}}"
    if boxed == "always" or _BOX_OPEN.search(response):
        return None, None  # no box, or only unclosed (truncated) ones
    return None, response


def math_reward(response: str, ground_truth: str, answer_pattern: str | None = None,
                boxed: str = "auto") -> RewardResult:
    """1.0 when the response's final answer equals ``ground_truth`` mathematically, else 0.0.

    Args:
        answer_pattern: a regex with one capturing group; the last match's group is the answer.
        boxed: "auto" (the last ``\\boxed{}`` if any, else the whole response), "always" (only boxed
            answers count) or "never" (the whole response). Ignored when ``answer_pattern`` is given.
    """
    answer, text = _extract(response, answer_pattern, boxed)
    if text is None:
        return RewardResult(score=0.0, correct=False, info={"extracted": None})
    truth = ground_truth.strip()
    whole = answer is None
    candidate = text.strip() if whole else answer
    if _INT.match(truth) and _INT.match(candidate):
        ok = int(candidate) == int(truth)
        return RewardResult(score=float(ok), correct=ok, info={"extracted": candidate[:_INFO_CHARS]})
    from math_verify import parse, verify

    gold = _gold(truth)
    if not gold:
        raise ValueError(f"ground truth {ground_truth!r} cannot be parsed as a math answer")
    pred = parse(text, parsing_timeout=None)
    ok = bool(pred) and verify(gold, pred, timeout_seconds=None)
    if whole:  # what math-verify took as the answer
        answer = str(pred[-1]) if pred else None
    info = {"extracted": None if answer is None else answer[:_INFO_CHARS]}
    return RewardResult(score=float(ok), correct=ok, info=info)


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
