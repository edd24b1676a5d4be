"""An example reward function: full credit for the exact integer, partial credit when close."""

from gyre.types import RewardResult


def close_enough(response: str, ground_truth: str, tolerance: int = 2) -> RewardResult:
    try:
        answer = int(response.strip())
    except ValueError:
        return RewardResult(score=0.0, correct=False)
    error = abs(answer - int(ground_truth))
    if error == 0:
        return RewardResult(score=1.0, correct=True)
    return RewardResult(score=max(0.0, 0.5 * (1 - error / (tolerance + 1))), correct=False)
