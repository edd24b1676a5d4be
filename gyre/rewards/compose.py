"""A base reward plus weighted shaping terms (format, length, ...), scored in one reward process.

``reward = base + sum(weight * term)``; the base decides correctness, the terms only move the score.
Each term's value is kept in ``info["shaping"]`` so a run can tell format gains from answer gains.
"""

from __future__ import annotations

from functools import cache

from gyre.rewards.base import RewardRequest, call_reward, load_function
from gyre.types import RewardResult


@cache
def _fn(spec: str):
    return load_function(spec)


def shaped_reward(response: str, ground_truth: str, *, base: str, base_kwargs: dict, terms: list[dict],
                  prompt: str = "", tag: str | None = None, **per_request) -> RewardResult:
    """Score with ``base`` (per-request options such as a code timeout go to it), then add the terms."""
    request = RewardRequest(response, ground_truth, prompt, tag)
    result = call_reward(_fn(base), request, {**base_kwargs, **per_request})
    shaping = {}
    for term in terms:
        value = call_reward(_fn(term["function"]), request, term["kwargs"]).score
        shaping[term["function"].rpartition(":")[2]] = value
        result.score += term["weight"] * value
    result.info = {**result.info, "shaping": shaping}
    return result
