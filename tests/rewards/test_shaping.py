import re
import time

import pytest

from gyre.rewards.base import RewardRequest, call_reward
from gyre.rewards.shaping import format_reward, length_penalty, overlong_penalty


@pytest.mark.parametrize("response,expected", [
    ("The answer is \\boxed{42}.", 1.0),
    ("line one\n\\boxed{\\frac{1}{2}}\nline three", 1.0),  # DOTALL: "." spans lines
    ("\\boxed{}", 0.0),  # ".+" needs content
    ("the answer is 42", 0.0),
    ("", 0.0),
])
def test_format_reward_default_pattern(response, expected):
    assert format_reward(response) == expected


def test_format_reward_custom_pattern_score_and_penalty():
    pattern = r"<think>.+</think>\s*<answer>.+</answer>"
    good = "<think>a\nb</think>\n<answer>4</answer>"
    assert format_reward(good, "4", pattern=pattern, score=0.5, penalty=-0.1) == 0.5
    assert format_reward(good + " trailing", "4", pattern=pattern, score=0.5, penalty=-0.1) == -0.1  # fullmatch
    assert format_reward("<answer>4</answer>", pattern=pattern, penalty=-1) == -1.0


def test_format_reward_fits_the_reward_contract():
    result = call_reward(format_reward, RewardRequest(response="\\boxed{1}", ground_truth="1"), {"penalty": -0.5})
    assert result.score == 1.0 and result.correct is None
    result = call_reward(format_reward, RewardRequest(response="1", ground_truth="1"), {"penalty": -0.5})
    assert result.score == -0.5


@pytest.mark.parametrize("tokens,expected", [
    (16000, 0.0),
    (16384, 0.0),  # L_max - L_cache: the band starts after it
    (18000, -0.3945),  # (16384 - 18000) / 4096 = -0.39453125, the DAPO example
    (20480, -1.0),
    (21000, -1.0),
    (0, 0.0),
])
def test_overlong_penalty_dapo(tokens, expected):
    assert overlong_penalty(tokens, 20480, 4096) == pytest.approx(expected, abs=1e-4)


def test_overlong_penalty_exact_and_type():
    value = overlong_penalty(18000, 20480, 4096)
    assert isinstance(value, float) and value == -0.39453125
    assert overlong_penalty(15, 20, 10) == -0.5  # (10 - 15) / 10


def test_overlong_penalty_rejects_bad_band():
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty(10, 100, 0)
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty(10, 100, 200)


@pytest.mark.parametrize("length,target,coef,expected", [
    (500, 1000, 0.001, 0.0),
    (1000, 1000, 0.001, 0.0),
    (1500, 1000, 0.001, -0.5),
    (3000, 1000, 0.0005, -1.0),
    (10, 0, 0.1, -1.0),
])
def test_length_penalty(length, target, coef, expected):
    assert length_penalty("x" * length, "", target_chars=target, coef=coef) == pytest.approx(expected)


def test_length_penalty_defaults_and_validation():
    assert length_penalty("x" * 1200) == pytest.approx(-0.2)
    with pytest.raises(ValueError):
        length_penalty("x", coef=-1.0)
    with pytest.raises(ValueError):
        length_penalty("x", target_chars=-1)


@pytest.mark.parametrize("response", [
    "x \\boxed{1} y", "\\boxed{}", "\\boxed{}}", "a\n\\boxed{\n}\n", "\\boxed{", "no", "\\boxed{}\\boxed{1}",
    "\\boxed{\\boxed{}", "}\\boxed{", "\\boxed \\boxed{x}",
])
def test_default_pattern_equals_the_naive_one(response):
    naive = r"(?s).*\\boxed\{.+\}.*"
    assert format_reward(response) == float(re.fullmatch(naive, response) is not None)


def test_format_reward_is_linear_on_unclosed_boxes():
    start = time.perf_counter()
    assert format_reward("\\boxed{" * 200_000) == 0.0
    assert format_reward("\\boxed{" * 200_000 + "x}") == 1.0
    assert time.perf_counter() - start < 2
