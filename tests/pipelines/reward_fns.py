"""Reward functions used by the pipeline tests (they give a random tiny model a learning signal)."""

from gyre.types import RewardResult


def _fraction(response: str) -> float:
    return sum(c.isdigit() for c in response) / max(1, len(response))


def digit_fraction(response: str, ground_truth: str) -> RewardResult:
    """Fraction of the response's characters that are digits; "correct" (for accuracy) when most are."""
    score = _fraction(response)
    return RewardResult(score=score, correct=score >= 0.5)


def plain_digit_fraction(response: str, ground_truth: str) -> float:
    """The digit fraction as a plain float: a reward that does not judge correctness."""
    return _fraction(response)


def weighted_digit_fraction(response: str, ground_truth: str, weight: float) -> float:
    """The digit fraction times the prompt row's own ``weight`` column (TRL style: a column is a keyword)."""
    return weight * _fraction(response)


def fails_on_real_responses(response: str, ground_truth: str):
    """Passes the pre-flight probe (the ground truth and the empty response score), returns junk for
    anything a policy writes: only the run's error-share check can stop it."""
    if response in ("", ground_truth):
        return float(response == ground_truth)
    return "not a number"


def uniform_on_even_prompts(response: str, ground_truth: str) -> float:
    """The same score for every sample of prompts whose answer is even (dynamic sampling drops those
    groups); the digit fraction otherwise."""
    if ground_truth.lstrip("-").isdigit() and int(ground_truth) % 2 == 0:
        return 1.0
    return digit_fraction(response, ground_truth)
