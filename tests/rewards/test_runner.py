import os
import signal
from pathlib import Path

import pytest

from gyre.rewards.base import RewardRequest, RewardSpecError, load_function, to_result
from gyre.rewards.runner import MAX_RERUNS, RewardRunner, RunnerFaults, RunnerSpec, sample_deadline
from gyre.types import RewardResult
from tests.cluster.faults import SignalOnStart, gone

FNS = Path(__file__).resolve().parents[1] / "cluster" / "pool_rewards.py"

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
    # A function that ends its own process is re-run on fresh processes a bounded number of times, then fails.
    assert "exited with code 3" in out[4].error and f"ran {MAX_RERUNS + 1} times" in out[4].error
    assert runner.take_faults().child_deaths == MAX_RERUNS + 1
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


RESPONSES = ["a", "bb", "boom", "dddd", "eeeee", "ffffff", "g", "hh"]


def comparable(results):
    """What a scoring decides (everything but timings)."""
    return [(r.score, r.correct, r.status, r.error, r.info) for r in results]


@pytest.fixture(scope="module")
def slow_runner():
    r = RewardRunner(f"{FNS}:slow_score", {"delay": 0.3}, timeout_s=1.5, processes=2)
    yield r
    r.close()


@pytest.fixture(scope="module")
def expected(slow_runner):
    """An uninterrupted scoring of RESPONSES."""
    out = comparable(slow_runner.score([RewardRequest(r, "") for r in RESPONSES]))
    assert out[2] == (0.0, False, "error", "ValueError: bad response", {})
    assert out[3] == (0.4, True, "ok", None, {"length": 4})
    assert slow_runner.take_faults() == RunnerFaults()
    return out


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["SIGKILL", "SIGSTOP"])
def test_a_child_killed_or_stopped_mid_sample_is_replaced_and_its_sample_re_run(slow_runner, expected, tmp_path, sig):
    requests = [RewardRequest(r, "", options={"marks": str(tmp_path)}) for r in RESPONSES]
    # "a" opens its child's chunk: a signal that arrives late still finds that child mid-sample.
    with SignalOnStart(tmp_path, "a", sig) as fault:
        got = slow_runner.score(requests)
    assert comparable(got) == expected  # the sample was re-run, not scored 0 or as a timeout
    faults = slow_runner.take_faults()
    assert (faults.child_deaths, faults.child_stops) == ((1, 0) if sig == signal.SIGKILL else (0, 1))
    assert gone(fault.pid) and fault.pid not in slow_runner.child_pids()
    assert comparable(slow_runner.score(requests)) == expected  # still usable


def test_idle_children_found_stopped_are_replaced_before_they_get_work(slow_runner, expected):
    stopped = slow_runner.child_pids()
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    assert comparable(slow_runner.score([RewardRequest(r, "") for r in RESPONSES])) == expected
    assert slow_runner.take_faults() == RunnerFaults(child_stops=len(stopped))
    assert all(gone(pid) for pid in stopped)


def test_a_function_s_own_deadline_replaces_the_domain_timeout():
    fn = load_function(f"{FNS}:sleeps")
    # deadline_s gets the domain kwargs merged with the request's options; None falls back to timeout_s.
    assert sample_deadline(fn, RewardRequest("0", "3"), {"scale": 2.0}, 10.0) == 6.0
    assert sample_deadline(fn, RewardRequest("0", "3", options={"scale": 0.5}), {"scale": 2.0}, 10.0) == 1.5
    assert sample_deadline(fn, RewardRequest("0", ""), {"scale": 2.0}, 10.0) == 10.0
    assert sample_deadline(fn, RewardRequest("0", "x"), {}, 10.0) == 10.0  # unreadable: the call reports it
    with pytest.raises(ValueError, match="positive number of seconds"):
        sample_deadline(fn, RewardRequest("0", "-1"), {}, 10.0)
    assert sample_deadline(load_function("gyre.rewards.math:math_reward"), RewardRequest("0", "3"), {}, 7.0) == 7.0
    assert RunnerSpec(f"{FNS}:sleeps", {}, 4.0).deadlines([RewardRequest("0", "2"), RewardRequest("0", "")]) == [2, 4]
    # Shaping terms keep the base's deadline, plus a margin.
    from gyre.rewards.compose import SHAPING_MARGIN_S, shaped_reward

    terms = [{"function": "gyre.rewards.shaping:length_penalty", "kwargs": {}, "weight": 1.0}]
    shaped = {"base": f"{FNS}:sleeps", "base_kwargs": {"scale": 2.0}, "terms": terms}
    assert shaped_reward.deadline_s("3", **shaped) == 6.0 + SHAPING_MARGIN_S
    assert shaped_reward.deadline_s("3", **shaped, scale=1.0) == 3.0 + SHAPING_MARGIN_S
    assert shaped_reward.deadline_s("3", **{**shaped, "base": "gyre.rewards.math:math_reward"}) is None

    runner = RewardRunner(f"{FNS}:sleeps", {"scale": 1.0}, timeout_s=0.2, processes=2)
    try:
        out = runner.score([RewardRequest("0.6", "30"), RewardRequest("0.6", ""),
                            RewardRequest("0.6", "0.1", options={"scale": 300.0})])
    finally:
        runner.close()
    assert [o.status for o in out] == ["ok", "timeout", "ok"]
    assert out[1].error == "timeout after 0.2s" and out[1].latency_s == 0.2
