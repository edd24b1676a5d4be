"""Reward functions used by the pipeline tests (they give a random tiny model a learning signal)."""


def digit_fraction(response: str, ground_truth: str) -> float:
    """Fraction of the response's characters that are digits."""
    return sum(c.isdigit() for c in response) / max(1, len(response))


def fails_on_real_responses(response: str, ground_truth: str):
    """Passes the pre-flight probe (the ground truth and the empty response score), returns junk for
    anything a policy writes: only the run's error-share check can stop it."""
    if response in ("", ground_truth):
        return float(response == ground_truth)
    return "not a number"
