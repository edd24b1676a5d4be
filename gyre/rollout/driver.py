"""The rollout IO loop: the one place that waits on rollout engines and reward workers together.

It carries out the scheduler's commands (``Generate`` on an engine, ``Score`` on the reward pool) and turns
what comes back into the scheduler's events, until the caller's condition holds (a batch is ready).
Engines stream finished samples back in parts, so each is scored as soon as it is generated. A dead
or stalled engine raises ``RoleFault`` (named role, rank, cause) within the watchdog's deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from gyre.cluster.faults import CallClock, fault_from
from gyre.cluster.group import RoleGroup
from gyre.rollout.scheduler import Generate, RolloutScheduler, Score


@dataclass
class PhaseTimes:
    """Where one ``run`` spent its wall-clock time."""

    generate: float = 0.0
    """Until the last engine finished (scoring overlaps it)."""
    reward: float = 0.0
    """Scoring still running after the engines finished."""


class RolloutDriver:
    def __init__(self, engines: RoleGroup, rewards, stream_parts: int = 8):
        self.engines = engines
        self.rewards = rewards
        """The reward pool (``gyre.cluster.reward_pool.RewardPool``)."""
        self.stream_parts = stream_parts

    def run(self, scheduler: RolloutScheduler, commands: list, done: Callable[[], bool],
            label: str = "train") -> PhaseTimes:
        """Carry out ``commands`` and every command they lead to until ``done()``; ``label`` keeps the usual
        durations of different kinds of generation (training, validation) apart in the watchdog."""
        t0 = time.perf_counter()
        streams: dict = {}
        scoring: list = []
        self._dispatch(commands, streams, scoring)
        clock = CallClock(self.engines.watchdog, self.engines.name, f"generate({label})")
        while streams:
            if clock.expired():
                raise clock.hung(self.engines.actors, sorted(streams.values()))
            for part in self._parts(streams, clock.slice(), label):
                self._dispatch(scheduler.on_generated(part), streams, scoring)
            clock.tick()
        clock.done()
        times = PhaseTimes(generate=time.perf_counter() - t0)
        if scoring:
            self.rewards.wait()
            scheduler.on_scored(scoring)
        times.reward = time.perf_counter() - t0 - times.generate
        if not done():
            raise RuntimeError("the rollout went idle before the batch was complete (the scheduler admitted too "
                               "few groups)")
        return times

    def _dispatch(self, commands: list, streams: dict, scoring: list) -> None:
        for command in commands:
            if isinstance(command, Generate):
                actor = self.engines.actors[command.engine]
                streams[actor.generate_stream.remote(list(command.requests), self.stream_parts)] = command.engine
            elif isinstance(command, Score):
                scoring.extend(command.trajectories)
                self.rewards.submit(list(command.trajectories))
            else:
                raise TypeError(f"unknown rollout command {command!r}")

    def _parts(self, streams: dict, timeout: float, label: str) -> list:
        """The parts that arrived within ``timeout`` (ended streams removed)."""
        import ray

        ready, _ = ray.wait(list(streams), num_returns=1, timeout=timeout)
        parts = []
        for stream in ready:
            try:
                parts.append(ray.get(next(stream)))
            except StopIteration:
                del streams[stream]
            except Exception as exc:  # noqa: BLE001 - a dead or failing engine, named in a RoleFault
                raise fault_from(exc, self.engines.name, streams[stream], f"generate({label})") from None
        return parts
