"""A base reward plus weighted shaping terms (format, length, ...), scored in one reward process.

``reward = base + sum(weight * term)``; the base decides correctness, the terms only move the score.
Each term's value is kept in ``info["shaping"]`` so a run can tell format gains from answer gains.
A base with its own per-sample deadline (``deadline_s``, e.g. the code reward's) keeps it, plus a
small margin for the terms.
"""

from __future__ import annotations

import dataclasses
from functools import cache

from gyre.rewards.base import RewardRequest, call_reward, load_function
from gyre.types import RewardResult

SHAPING_MARGIN_S = 1.0
"""Added to the base's deadline for the shaping terms (cheap text checks)."""


@cache
def _fn(spec: str):
    return load_function(spec)


def shaped_reward(request: RewardRequest, *, base: str, base_kwargs: dict, terms: list[dict]) -> RewardResult:
    """Score with ``base`` (per-request options such as a code timeout go to it), then add the terms.
    Each function gets the data columns its signature takes (``call_reward``)."""
    result = call_reward(_fn(base), request, base_kwargs)
    plain = dataclasses.replace(request, options={})  # the options are the base's (a code timeout)
    shaping = {}
    for term in terms:
        value = call_reward(_fn(term["function"]), plain, term["kwargs"]).score
        shaping[term["function"].rpartition(":")[2]] = value
        result.score += term["weight"] * value
    result.info = {**result.info, "shaping": shaping}
    return result


shaped_reward.takes_request = True  # call_reward hands it the whole request, columns and options


def _deadline_s(ground_truth: str, *, base: str, base_kwargs: dict, terms: list[dict], **per_request) -> float | None:
    """The base function's per-sample deadline (see ``gyre.rewards.runner.sample_deadline``) plus
    ``SHAPING_MARGIN_S``; None, the domain's timeout_s, when the base has none."""
    own = getattr(_fn(base), "deadline_s", None)
    value = own(ground_truth, **{**base_kwargs, **per_request}) if callable(own) else None
    return None if value is None else value + SHAPING_MARGIN_S


shaped_reward.deadline_s = _deadline_s
