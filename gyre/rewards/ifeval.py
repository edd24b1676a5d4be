"""IFEval-style verifiable instruction constraints (after Zhou et al. 2023, "Instruction-Following
Evaluation for Large Language Models", arXiv 2311.07911).

What it checks: every constraint listed in the ground truth, a JSON string
``{"constraints": [{"type": "...", ...parameters}, ...]}``. The score is the fraction satisfied (ROLL's
IFEval reward allows such soft partial credit) or, with ``partial_credit=False``, 1.0 only when all are;
``correct`` is whether all are; ``info["satisfied"]`` lists one bool per constraint.

==================  ==========================  ===============================================================
type                parameters                  satisfied when
==================  ==========================  ===============================================================
word_count          min and/or max (ints)       min <= number of words <= max
contains_keywords   keywords (list of str)      each keyword occurs as a whole word/phrase, any case
forbidden_words     words (list of str)         none occurs as a whole word/phrase, any case
no_commas           -                           no "," at all
lowercase           -                           has letters and none is upper case
uppercase           -                           has letters and none is lower case
starts_with         phrase (str)                the response, leading whitespace ignored, starts with it
ends_with           phrase (str)                the response, trailing whitespace ignored, ends with it
bullet_points       count (int)                 exactly count lines start (after indentation) with "* " or "- "
json_format         -                           the whole response is JSON, optionally in a ```json fence
num_paragraphs      count (int)                 exactly count non-empty paragraphs, split at blank lines or
                                                a free-standing "***"
quotation           -                           the whole response is wrapped in double quotes ("..." or “...”)
placeholder         count (int)                 at least count placeholders like [name] (not [links](...))
sections            marker (str), count (int)   at least count section headers "<marker> <number>"
==================  ==========================  ===============================================================

Deviations from IFEval: no language detection (IFEval also requires English for lowercase/uppercase);
words are runs of letters and digits, joined by apostrophes or hyphens ("don't" is one word, IFEval's
``\\w+`` tokenizer counts two); starts_with/ends_with are case-sensitive (IFEval lower-cases the end
phrase); word_count takes both bounds in one constraint; unknown or missing parameters are errors, not
silently ignored, so that a typo in the data cannot make a constraint vacuous.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable

from gyre.types import RewardResult

_WORD = re.compile(r"\w+(?:['’-]\w+)*")
_BULLET = re.compile(r"^[ \t]*[*-] ", re.MULTILINE)
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n|(?:^|(?<=\s))\*\*\*(?=\s|$)")
_PLACEHOLDER = re.compile(r"\[[^\[\]\n]+\](?!\()")
_FENCE = re.compile(r"^```[ \t]*(?:json)?[ \t]*\n(.*)\n[ \t]*```$", re.DOTALL | re.IGNORECASE)


def _phrase_regex(phrase: str) -> re.Pattern:
    # Whole word: "cat" must not match inside "category"; lookarounds, not \b, so "C++" works too.
    return re.compile(rf"(?<!\w){re.escape(phrase)}(?!\w)", re.IGNORECASE)


def _is_json(text: str) -> bool:
    fenced = _FENCE.match(text.strip())
    try:
        json.loads(fenced.group(1) if fenced else text)
    except ValueError:
        return False
    return True


def _word_count(text: str, p: dict) -> bool:
    n = len(_WORD.findall(text))
    return p.get("min", 0) <= n <= p.get("max", n)


def _paragraphs(text: str) -> int:
    return sum(1 for part in _PARAGRAPH_BREAK.split(text) if part.strip())


def _quoted(text: str) -> bool:
    s = text.strip()
    return len(s) >= 2 and (s[0], s[-1]) in {('"', '"'), ("“", "”")}


# type -> (check(response, params), {parameter: kind}); kinds: "int" (>= 0), "str" (non-empty), "strs".
_CHECKS: dict[str, tuple[Callable[[str, dict], bool], dict[str, str]]] = {
    "word_count": (_word_count, {"min": "int", "max": "int"}),
    "contains_keywords": (lambda t, p: all(_phrase_regex(k).search(t) for k in p["keywords"]),
                          {"keywords": "strs"}),
    "forbidden_words": (lambda t, p: not any(_phrase_regex(w).search(t) for w in p["words"]), {"words": "strs"}),
    "no_commas": (lambda t, p: "," not in t, {}),
    # str.islower/isupper: at least one cased character and none of the other case.
    "lowercase": (lambda t, p: t.islower(), {}),
    "uppercase": (lambda t, p: t.isupper(), {}),
    "starts_with": (lambda t, p: t.lstrip().startswith(p["phrase"]), {"phrase": "str"}),
    "ends_with": (lambda t, p: t.rstrip().endswith(p["phrase"]), {"phrase": "str"}),
    "bullet_points": (lambda t, p: len(_BULLET.findall(t)) == p["count"], {"count": "int"}),
    "json_format": (lambda t, p: _is_json(t), {}),
    "num_paragraphs": (lambda t, p: _paragraphs(t) == p["count"], {"count": "int"}),
    "quotation": (lambda t, p: _quoted(t), {}),
    "placeholder": (lambda t, p: len(_PLACEHOLDER.findall(t)) >= p["count"], {"count": "int"}),
    "sections": (lambda t, p: len(re.findall(rf"(?<!\w){re.escape(p['marker'])}\s*\d+", t)) >= p["count"],
                 {"marker": "str", "count": "int"}),
}
# Parameters that may be left out (word_count needs at least one of its bounds).
_OPTIONAL = {"word_count": {"min", "max"}}


def _check_params(where: str, kind: str, params: dict) -> None:
    known = _CHECKS[kind][1]
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown parameter(s) {unknown}; {kind} takes {sorted(known) or 'none'}")
    missing = sorted(set(known) - set(params) - _OPTIONAL.get(kind, set()))
    if missing or (kind == "word_count" and not params):
        raise ValueError(f"{where}: missing parameter(s) {missing or ['min or max']}")
    for name, value in params.items():
        expected = known[name]
        if expected == "int" and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"{where}: {name} must be a non-negative integer, got {value!r}")
        if expected == "str" and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"{where}: {name} must be a non-empty string, got {value!r}")
        if expected == "strs" and (not isinstance(value, list) or not value
                                   or not all(isinstance(v, str) and v.strip() for v in value)):
            raise ValueError(f"{where}: {name} must be a non-empty list of non-empty strings, got {value!r}")
    if kind == "word_count" and params.get("min", 0) > params.get("max", float("inf")):
        raise ValueError(f"{where}: min {params['min']} exceeds max {params['max']}")


@functools.lru_cache(maxsize=4096)
def _parse(ground_truth: str) -> tuple[tuple[str, dict], ...]:
    """((type, parameters), ...) from the ground-truth JSON; cached, as every sample of a prompt repeats it."""
    try:
        data = json.loads(ground_truth)
    except ValueError as exc:
        raise ValueError(f"ifeval ground truth is not JSON ({exc}): {ground_truth[:200]!r}") from None
    constraints = data.get("constraints") if isinstance(data, dict) else None
    if not isinstance(constraints, list) or not constraints:
        raise ValueError('ifeval ground truth must be {"constraints": [...]} with at least one constraint')
    parsed = []
    for i, item in enumerate(constraints):
        kind = item.get("type") if isinstance(item, dict) else None
        where = f"constraint {i} ({kind if isinstance(kind, str) else repr(item)[:100]})"
        if not isinstance(kind, str) or kind not in _CHECKS:
            raise ValueError(f"{where}: unknown type; known types: {', '.join(sorted(_CHECKS))}")
        params = {k: v for k, v in item.items() if k != "type"}
        _check_params(where, kind, params)
        parsed.append((kind, params))
    return tuple(parsed)


def check_ground_truth(gt: str) -> None:
    """Raise ValueError naming the first bad constraint (unknown type, missing or ill-typed parameter)."""
    _parse(gt)


def ifeval_reward(response: str, ground_truth: str, partial_credit: bool = True) -> RewardResult:
    """Fraction of the ground truth's constraints the response satisfies (``partial_credit``), or 1.0 only
    when it satisfies them all."""
    satisfied = [bool(_CHECKS[kind][0](response, params)) for kind, params in _parse(ground_truth)]
    everything = all(satisfied)
    score = sum(satisfied) / len(satisfied) if partial_credit else float(everything)
    return RewardResult(score=score, correct=everything, info={"satisfied": satisfied})
