"""Reward functions for the reward-pool and runner tests (loaded by path in the workers' child processes)."""

import os
import signal
import time
from pathlib import Path

from gyre.types import RewardResult


def length_reward(response, ground_truth):
    return float(len(response))


def kill_worker_once(response, ground_truth, marker):
    """Kill the reward worker actor (this process's parent) the first time only."""
    path = Path(marker)
    if not path.exists():
        path.write_text("killed")
        os.kill(os.getppid(), signal.SIGKILL)
    return 1.0


def by_columns(response, ground_truth, difficulty, weights=None):
    """A TRL-style reward reading the prompt row's own columns (it ignores the row's other columns)."""
    return float(difficulty) * weights[len(response) - 1]


def raises(response, ground_truth):
    raise ValueError("bad reward")


def slow_score(response, ground_truth, marks=None, delay=0.3):
    """Deterministic, and slow enough for a fault to land mid-sample. Each start leaves a file
    "<response>.<pid>.<parent pid>.<time>" in ``marks``, so a test can find the processes scoring a response."""
    if marks:
        Path(marks, f"{response}.{os.getpid()}.{os.getppid()}.{time.time_ns()}").touch()
    time.sleep(delay)
    if response == "boom":
        raise ValueError("bad response")
    return RewardResult(score=len(response) / 10, correct=len(response) % 2 == 0, info={"length": len(response)})


def sleeps(response, ground_truth, scale=1.0):
    """Sleeps ``response`` seconds; its deadline is ``ground_truth`` x ``scale`` seconds (none when empty)."""
    time.sleep(float(response))
    return 1.0


def _sleeps_deadline(ground_truth, scale=1.0):
    return float(ground_truth) * scale if ground_truth else None


sleeps.deadline_s = _sleeps_deadline
