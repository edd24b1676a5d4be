"""Simulated reward workers and environments: latency drawn from the workload, answers on the clock.

``SimRewards`` scores trajectories on ``workers`` workers, first come first served (a trajectory waits
for a free worker, then takes its drawn latency); ``SimEnvs`` answers the episode runner's ``EnvCall``
commands with resets and steps of a simulated environment (turn count, observation length and latency
from the workload), on ``slots`` environments that each take one call at a time. An environment call
may fail after its latency, or hang and fail at its deadline (the real pool kills the child then), as
the workload's failure and hang rates say; the episode runner replaces the episode, or gives its group up
after ``env.max_failures``, exactly as in a real run. Both hand back what is due by a time (``due(now)``)
and say when their next answer is (``next_event``).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from gyre.envs.calls import EnvCall, EnvResult
from gyre.envs.protocol import EnvFailure, EnvReset, EnvStep
from gyre.sim.workload import Workload
from gyre.types import RewardResult, Trajectory


@dataclass
class SimRewards:
    workload: Workload
    workers: int
    """Reward calls that run at once (0: unbounded, a serverless pool)."""
    _heap: list = field(default_factory=list)
    _queue: deque = field(default_factory=deque)
    _free_at: list[float] = field(default_factory=list)
    _seq: int = 0
    busy_s: float = 0.0

    def __post_init__(self) -> None:
        self._free_at = [0.0] * self.workers
        heapq.heapify(self._free_at)

    def submit(self, trajectories, now: float) -> None:
        for t in trajectories:
            latency = self.workload.reward_latency(t.prompt, t.sample_index)
            start = now
            if self.workers:
                start = max(now, heapq.heappop(self._free_at))
                heapq.heappush(self._free_at, start + latency)
            self.busy_s += latency
            self._seq += 1
            heapq.heappush(self._heap, (start + latency, self._seq, t))

    def next_event(self) -> float:
        return self._heap[0][0] if self._heap else float("inf")

    def due(self, now: float) -> list[Trajectory]:
        out = []
        while self._heap and self._heap[0][0] <= now:
            _, _, t = heapq.heappop(self._heap)
            correct = self.workload.correct(t.prompt, t.sample_index)
            t.reward = RewardResult(float(correct), correct)
            out.append(t)
        return out

    @property
    def busy(self) -> bool:
        return bool(self._heap)


class WordTokenizer:
    """What the episode runner's ``ContextBuilder`` needs of a tokenizer: one id per word."""

    eos_token_id = None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [1] * len(text.split())}

    def decode(self, ids) -> str:
        return " ".join("w" for _ in ids)


@dataclass
class SimEnvs:
    """Environments of a multi-turn workload: an episode lasts ``workload.turns(seed)`` turns."""

    workload: Workload
    latency_scale: float = 1.0
    """Multiplies every latency (environments sharing the GPU hosts' CPUs run slower)."""
    reset_timeout_s: float = 60.0
    step_timeout_s: float = 30.0
    """Deadlines of a reset and a step (env.reset_timeout_s, env.step_timeout_s): when a hung call fails."""
    failures: int = 0
    hangs: int = 0
    _heap: list = field(default_factory=list)
    _turns: dict[int, int] = field(default_factory=dict)
    """Slot -> turns taken in its current episode."""
    _length: dict[int, int] = field(default_factory=dict)
    """Slot -> turns its current episode lasts."""
    _seed: dict[int, int] = field(default_factory=dict)
    _seq: int = 0
    busy_s: float = 0.0

    def submit(self, call: EnvCall, now: float) -> None:
        self._seq += 1
        episode, _, n = call.call_id.rpartition("@")
        index = int(episode.rpartition("/")[2])  # the episode's index in its group
        if call.op == "reset":
            seed = int(call.arg)
            self._seed[call.slot], self._turns[call.slot] = seed, 0
            self._length[call.slot] = self.workload.turns(seed)
            value = EnvReset(self._words(self.workload.observation_tokens(seed, 0)))
        else:
            self._turns[call.slot] += 1
            turn, seed = self._turns[call.slot], self._seed[call.slot]
            done = turn >= self._length[call.slot]
            success = done and self.workload.env_success(seed, index)
            value = EnvStep(self._words(self.workload.observation_tokens(seed, turn)), float(success), done, False,
                            {"success": success} if done else {})
        # Keyed by the episode's identity (seed, index in its group, call number), not by arrival order: every
        # schedule sees the same latency for the same call, so comparisons between schedules are paired.
        key = (self._seed[call.slot], index, int(n))
        latency = self.workload.env_latency(key, call.op) * self.latency_scale
        fault = self.workload.env_fault(key)
        if fault == "hang":  # the slot is held until the deadline, then the call fails
            latency = self.reset_timeout_s if call.op == "reset" else self.step_timeout_s
            value, self.hangs = EnvFailure("timeout", f"simulated hang past {latency:g} s"), self.hangs + 1
        elif fault == "error":
            value, self.failures = EnvFailure("error", "simulated environment error"), self.failures + 1
        self.busy_s += latency
        heapq.heappush(self._heap, (now + latency, self._seq, EnvResult(call.call_id, value)))

    @staticmethod
    def _words(n: int) -> str:
        return " ".join(["o"] * n)

    def next_event(self) -> float:
        return self._heap[0][0] if self._heap else float("inf")

    def due(self, now: float) -> list[EnvResult]:
        out = []
        while self._heap and self._heap[0][0] <= now:
            out.append(heapq.heappop(self._heap)[2])
        return out
