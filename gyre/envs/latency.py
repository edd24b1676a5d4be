"""An environment whose every step takes a random time: a stand-in for environments that call out to
something slow (a simulator, a sandbox, a web service), for measuring how rollout schedules cope with
them (``bench/agentic_async.py``). Not a task worth learning: it only has to take time the way real
environments do.

An episode lasts ``turns`` model turns (the last one terminates it). Each ``step`` sleeps a latency drawn
from a lognormal distribution with mean ``mean_s`` and standard deviation ``cv * mean_s`` (cv = 1: the
standard deviation equals the mean; cv = 0: a constant latency). ``reset`` answers at once. The draw is
seeded by (``seed``, the episode's seed, the turn, the action): the same episode played with the same
actions waits the same time under any schedule, and the episodes of one group (same environment seed,
different actions) wait different times. A turn whose action contains ``target`` earns ``1 / turns``.
"""

from __future__ import annotations

import math
import random
import time


def lognormal_params(mean: float, cv: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal distribution with this mean and standard deviation ``cv * mean``:
    sigma^2 = ln(1 + cv^2), mu = ln(mean) - sigma^2 / 2."""
    sigma = math.sqrt(math.log1p(cv * cv))
    return math.log(mean) - sigma * sigma / 2, sigma


class LatencyEnv:
    def __init__(self, turns: int = 4, mean_s: float = 1.0, cv: float = 1.0, target: str = "a", seed: int = 0):
        if turns < 1 or mean_s <= 0 or cv < 0:
            raise ValueError(f"need turns >= 1, mean_s > 0 and cv >= 0 (got turns={turns}, mean_s={mean_s}, cv={cv})")
        self.turns, self.mean_s, self.cv, self.target, self.seed = turns, mean_s, cv, target, seed
        self.mu, self.sigma = lognormal_params(mean_s, cv)
        self.episode_seed: int | None = None
        self.turn = 0

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        self.episode_seed, self.turn = seed, 0
        return f"Say something with the letter {self.target!r} in it, {self.turns} times. Turn 1:", {}

    def latency(self, action: str) -> float:
        """Seconds the next step with ``action`` takes (see the module docstring)."""
        rng = random.Random(f"{self.seed}:{self.episode_seed}:{self.turn}:{action}")
        return rng.lognormvariate(self.mu, self.sigma)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        wait = self.latency(action)
        time.sleep(wait)
        self.turn += 1
        reward = 1.0 / self.turns if self.target in action else 0.0
        done = self.turn >= self.turns
        obs = "Done." if done else f"Turn {self.turn + 1}:"
        return obs, reward, done, False, {"latency_s": wait}
