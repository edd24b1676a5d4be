"""Multiple-choice answers: the response's final letter equals the ground truth's; score 1.0 or 0.0.

Ground truth: a letter (``"B"``), or JSON ``{"answer": "B", "choices": ["A", "B", "C", "D"]}``. Without
``choices`` the options are A-D, extended to the answer's letter when it lies beyond D (answer "F": A-F).
Only letters among the choices are read as answers.

Extraction, first stage that finds something wins:

1. the last ``\\boxed{...}`` whose content is a letter (``\\boxed{B}``, ``\\boxed{(b)}``, ``\\boxed{\\text{B}}``);
   a box holding something else (``\\boxed{42}``) is passed over;
2. the last "answer is (B)" / "Answer: B" / "answer: (B)" / "The answer is: **B**" / "answer is option B"
   phrase (the word "answer" followed by "is" or a colon); the letter must be upper case here, so that
   "the answer is a number" is not read as option A;
3. a response that is only a letter, with optional parentheses, period or bold: "B", "(b)", "B.", "**B**".

The last explicit answer wins: "Answer: A ... on reflection, answer: C" is C. A final answer that names
several different letters ("Answer: A or B", "answer: A, C", ``\\boxed{A/B}``) is ambiguous and scores 0,
without falling back to earlier answers or later stages; a bare "A or B" or a list of every option
("A B C D") is not an answer at all.

Prior art: the answer-extraction rules of multiple-choice evaluations (MMLU/GPQA harnesses such as
lm-evaluation-harness and simple-evals' "Answer: X" regex) and ROLL's multiple-choice rule reward.
Deviations: a fixed, documented extraction order instead of a single regex, and ambiguous answers are
wrong instead of being resolved to their first or last letter.
"""

from __future__ import annotations

import functools
import json
import re
import string
from collections import deque
from dataclasses import dataclass

from gyre.data.answers import last_boxed
from gyre.types import RewardResult

_DEFAULT_LAST = "D"
_WRAPPER = re.compile(r"^\\(?:text|textbf|mathrm|mathbf)\s*\{(.*)\}$", re.DOTALL)
_DECORATION = " \t\n$*."  # around a boxed letter: math mode, bold, a full stop
_BARE = re.compile(r"^\s*[*$]*\(?([A-Za-z])\)?[*$]*\.?\s*$")


@dataclass(frozen=True)
class _Patterns:
    token: re.Pattern  # one option letter, e.g. "(B)", "$B$" or "B**"
    more: re.Pattern  # ", C" / " or (C)" / "/C": a further letter in the same answer
    phrase: re.Pattern  # "answer is" / "answer:" followed by a letter


@functools.lru_cache(maxsize=64)
def _patterns(choices: str) -> _Patterns:
    # Runs of "*" (bold) and whitespace are each matched by one class, never by two adjacent ones:
    # overlapping repeats would backtrack quadratically on a long run of them.
    token = rf"\$?\(?([{choices}])\)?[*$]*(?!\w)"
    phrase = rf"(?i:\banswer\b)[*\s]*(?:(?i:is\b)[*\s]*(?:[:：][*\s]*)?|[:：][*\s]*)(?:(?i:option|choice)\s+)?{token}"
    more = rf"\s*(?:,|/|&|(?i:\bor\b|\band\b))[*\s]*{token}"
    return _Patterns(re.compile(token), re.compile(more), re.compile(phrase))


@functools.lru_cache(maxsize=4096)
def _parse(ground_truth: str) -> tuple[str, str]:
    """(answer letter, choice letters) from a ground truth; ValueError when it is malformed."""
    text = ground_truth.strip()
    if not text.startswith("{"):
        if len(text) != 1 or text.upper() not in string.ascii_uppercase:
            raise ValueError(f'choice ground truth must be a letter or {{"answer": ..., "choices": [...]}}, '
                             f"got {ground_truth[:100]!r}")
        answer, choices = text.upper(), None
    else:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"choice ground truth is not valid JSON ({exc}): {ground_truth[:100]!r}") from None
        if not isinstance(data, dict) or set(data) - {"answer", "choices"} or "answer" not in data:
            raise ValueError(f'choice ground truth must be {{"answer": "B", "choices": [...]}} (choices optional), '
                             f"got {ground_truth[:100]!r}")
        answer, choices = data["answer"], data.get("choices")
        if not isinstance(answer, str) or len(answer) != 1 or answer.upper() not in string.ascii_uppercase:
            raise ValueError(f"choice ground truth answer must be one letter A-Z, got {answer!r}")
        answer = answer.upper()
        if choices is not None:
            if (not isinstance(choices, list) or not choices or not all(
                    isinstance(c, str) and len(c) == 1 and c.upper() in string.ascii_uppercase for c in choices)):
                raise ValueError(f"choice ground truth choices must be a list of single letters, got {choices!r}")
            choices = "".join(sorted({c.upper() for c in choices}))
            if answer not in choices:
                raise ValueError(f"choice ground truth answer {answer!r} is not among the choices {list(choices)}")
    if choices is None:
        last = max(answer, _DEFAULT_LAST)
        choices = string.ascii_uppercase[:string.ascii_uppercase.index(last) + 1]
    return answer, choices


def check_ground_truth(gt: str) -> None:
    """Raise ValueError when ``gt`` is neither a letter nor a valid ``{"answer", "choices"}`` JSON object."""
    _parse(gt)


def _letters(text: str, first: re.Match, p: _Patterns) -> tuple[set[str], int]:
    """The letters named by the answer starting at ``first`` ("A", "A or B", "A, C"), and where it ends."""
    letters, end = {first.group(1)}, first.end()
    while (more := p.more.match(text, end)) is not None:
        letters.add(more.group(1))
        end = more.end()
    return letters, end


def _extract(response: str, choices: str) -> tuple[set[str], str | None]:
    """(letters named by the final answer, the stage that found it); an empty set when there is none."""
    p = _patterns(choices)
    content = last_boxed(response)
    if content is not None:
        content = content.strip(_DECORATION)
        while (wrapped := _WRAPPER.match(content)) is not None:
            content = wrapped.group(1).strip(_DECORATION)
        content = content.upper()  # in a box "b" can only mean option B
        if (first := p.token.match(content)) is not None:
            letters, end = _letters(content, first, p)
            if not content[end:].strip():
                return letters, "boxed"
    # Only the last match is wanted: a deque of one keeps it without a list of them all.
    last = next(iter(deque(p.phrase.finditer(response), maxlen=1)), None)
    if last is not None:
        return _letters(response, last, p)[0], "answer phrase"
    bare = _BARE.match(response)
    if bare is not None and bare.group(1).upper() in choices:
        return {bare.group(1).upper()}, "bare letter"
    return set(), None


def choice_reward(response: str, ground_truth: str) -> RewardResult:
    """1.0 when the response's final answer is the ground truth's letter, else 0.0 (see the module doc for
    how the answer is found)."""
    answer, choices = _parse(ground_truth)
    letters, source = _extract(response, choices)
    extracted = next(iter(letters)) if len(letters) == 1 else None
    info: dict = {"extracted": extracted, "source": source}
    if len(letters) > 1:
        info["ambiguous"] = sorted(letters)
    ok = extracted == answer
    return RewardResult(score=float(ok), correct=ok, info=info)
