import pytest

from gyre.rewards.math import math_reward


@pytest.mark.parametrize("response,truth,ok", [
    ("85", "85", True),
    ("86", "85", False),
    ("-4", "-4", True),
    ("The answer is \\boxed{\\frac{1}{2}}", "0.5", True),
    ("1/2", "\\frac12", True),
    ("\\boxed{3}", "3", True),
    ("3.0", "3", True),
    ("$\\frac{2}{4}$", "\\frac{1}{2}", True),
    ("so x = 7", "7", True),
    ("", "7", False),
    ("no number here", "7", False),
    ("\\boxed{\\sqrt{2}}", "\\sqrt{2}", True),
    ("\\boxed{2}", "\\sqrt{2}", False),
])
def test_math_reward(response, truth, ok):
    result = math_reward(response, truth)
    assert result.correct is ok
    assert result.score == (1.0 if ok else 0.0)


def test_unparseable_ground_truth_is_an_error():
    with pytest.raises(ValueError, match="cannot be parsed"):
        math_reward("1", "  ")
