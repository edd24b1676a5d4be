"""Reward functions for the reward-pool tests (loaded by path in the workers' child processes)."""

import os
import signal
from pathlib import Path


def length_reward(response, ground_truth):
    return float(len(response))


def kill_worker_once(response, ground_truth, marker):
    """Kill the reward worker actor (this process's parent) the first time only."""
    path = Path(marker)
    if not path.exists():
        path.write_text("killed")
        os.kill(os.getppid(), signal.SIGKILL)
    return 1.0


def raises(response, ground_truth):
    raise ValueError("bad reward")
