"""Reward functions used by the pipeline tests (they give a random tiny model a learning signal)."""


def digit_fraction(response: str, ground_truth: str) -> float:
    """Fraction of the response's characters that are digits."""
    return sum(c.isdigit() for c in response) / max(1, len(response))
