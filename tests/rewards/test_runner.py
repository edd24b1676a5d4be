import pytest

from gyre.rewards.base import RewardRequest, RewardSpecError, load_function, to_result
from gyre.rewards.runner import RewardRunner
from gyre.types import RewardResult

HOSTILE = '''
import os, time
def reward(response, ground_truth, prompt=None, bonus=0.0):
    if response == "raise":
        raise RuntimeError("boom")
    if response == "hang":
        while True:
            pass
    if response == "sleep":
        time.sleep(60)
    if response == "exit":
        os._exit(3)
    if response == "nan":
        return float("nan")
    if response == "str":
        return "yes"
    if response == "prompt":
        return prompt == "P"
    return float(response == ground_truth) + bonus
'''


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    path = tmp_path_factory.mktemp("rw") / "hostile.py"
    path.write_text(HOSTILE)
    r = RewardRunner(f"{path}:reward", {"bonus": 0.5}, timeout_s=1.0, processes=2)
    yield r
    r.close()


def test_failures_score_zero_and_are_counted_while_others_succeed(runner):
    responses = ["a", "raise", "hang", "a", "exit", "sleep", "nan", "str", "b", "prompt"]
    out = runner.score([RewardRequest(r, "a", prompt="P") for r in responses])
    scores = [o.score for o in out]
    assert scores == [1.5, 0.0, 0.0, 1.5, 0.0, 0.0, 0.0, 0.0, 0.5, 1.0]
    assert [o.status for o in out] == ["ok", "error", "timeout", "ok", "error", "timeout", "error", "error", "ok", "ok"]
    assert out[1].error.startswith("RuntimeError: boom")
    assert "exited with code 3" in out[4].error
    assert "must be finite" in out[6].error and "return a float" in out[7].error
    # The pool recovered: later batches still work.
    assert [o.score for o in runner.score([RewardRequest("a", "a")] * 5)] == [1.5] * 5


def test_load_function_errors(tmp_path):
    with pytest.raises(RewardSpecError, match="must look like"):
        load_function("nocolon")
    with pytest.raises(RewardSpecError, match="cannot import module"):
        load_function("no_such_module_xyz:fn")
    with pytest.raises(RewardSpecError, match="has no callable named 'nope'"):
        load_function("gyre.rewards.math:nope")
    with pytest.raises(RewardSpecError, match="does not exist"):
        load_function(f"{tmp_path}/missing.py:fn")


def test_to_result():
    import numpy as np
    import torch

    assert to_result(True) == RewardResult(1.0, True)
    assert to_result(0.25).score == 0.25 and to_result(0.25).correct is None
    assert to_result(np.float32(0.5)).score == 0.5 and to_result(torch.tensor(2.0)).score == 2.0
    assert to_result(3).score == 3.0
    for bad in (None, "1", [1.0]):
        with pytest.raises(TypeError):
            to_result(bad)
    for bad in (float("inf"), float("nan"), np.float64("-inf"), RewardResult(float("nan"))):
        with pytest.raises(ValueError, match="finite"):
            to_result(bad)


def test_example_reward_function_from_a_file():
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "rewards" / "close_enough.py"
    fn = load_function(f"{path}:close_enough")
    # exact -> 1; off by 1 with tolerance 2 -> 0.5 * (1 - 1/3) = 0.3333; not a number -> 0
    assert fn("85", "85").score == 1.0
    assert fn("86", "85", tolerance=2).score == pytest.approx(1 / 3)
    assert fn("x", "85").score == 0.0
