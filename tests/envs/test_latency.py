"""The slow environment of the agentic benchmark: its latency has the mean and spread asked for, is
seeded by the episode and the action, and its episodes last the turns asked for."""

import math
import statistics
import time

import pytest

from gyre.envs.latency import LatencyEnv, lognormal_params
from gyre.envs.protocol import check_reset, check_step


def test_lognormal_parameters_by_hand():
    # cv 1: sigma^2 = ln 2; mean 2: mu = ln 2 - ln 2 / 2 = ln 2 / 2.
    mu, sigma = lognormal_params(2.0, 1.0)
    assert sigma == pytest.approx(math.sqrt(math.log(2))) and mu == pytest.approx(math.log(2) / 2)
    assert lognormal_params(3.0, 0.0) == (pytest.approx(math.log(3.0)), 0.0)


def test_latency_mean_and_std_and_its_seeding():
    env = LatencyEnv(mean_s=0.5, cv=1.0, seed=3)
    env.reset(11)
    draws = [env.latency(f"action {i}") for i in range(20_000)]
    assert statistics.mean(draws) == pytest.approx(0.5, rel=0.05)
    assert statistics.stdev(draws) == pytest.approx(0.5, rel=0.1)  # std equal to the mean
    again = LatencyEnv(mean_s=0.5, cv=1.0, seed=3)
    again.reset(11)
    assert again.latency("action 7") == draws[7]  # the same episode and action wait the same
    again.reset(12)
    assert again.latency("action 7") != draws[7]  # another episode seed waits otherwise
    flat = LatencyEnv(mean_s=0.25, cv=0.0)
    flat.reset(0)
    assert [flat.latency(str(i)) for i in range(3)] == [pytest.approx(0.25)] * 3


def test_an_episode_sleeps_each_step_and_ends_after_its_turns():
    env = LatencyEnv(turns=3, mean_s=0.02, cv=0.0)
    assert "3 times" in check_reset(env.reset(5)).observation
    t0 = time.perf_counter()
    steps = [check_step(env.step(action)) for action in ("a cat", "dog", "a bat")]
    assert time.perf_counter() - t0 >= 3 * 0.02
    assert [s.reward for s in steps] == [pytest.approx(1 / 3), 0.0, pytest.approx(1 / 3)]
    assert [s.terminated for s in steps] == [False, False, True] and steps[0].observation == "Turn 2:"
    assert steps[0].info["latency_s"] == pytest.approx(0.02)
    with pytest.raises(ValueError, match="mean_s > 0"):
        LatencyEnv(mean_s=0)
