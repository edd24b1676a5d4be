"""The simulated cluster's event loop: the rollout driver's job on a virtual clock.

``SimCluster`` is a ``RolloutPort`` (``gyre.rollout.port``), as ``gyre.rollout.driver.RolloutDriver`` is
for Ray actors, so the simulator drives the real ``RolloutMachine``: it carries out the scheduler's
commands (``Generate`` on an engine, ``Abort``, ``Score``, ``EnvCall``) and turns what the engines,
reward workers and environments finish into the scheduler's events (``on_generated``, ``on_scored``,
``on_env``), until the caller's condition holds. Time jumps from one event to the next; engines' next
events sit in a heap (a thousand engines, one event at a time). Where it differs from the real driver:
``until`` is a virtual time (not the learner's calls), an engine never dies or hangs (nothing to replace),
and engines can join and leave mid-run (``join``, ``leave``): a leaving engine's requests are re-queued
by the scheduler, continued where the engine hands back their tokens.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from gyre.envs.calls import EnvCall
from gyre.rollout.port import PhaseTimes
from gyre.rollout.requests import Abort, Generate
from gyre.rollout.scheduler import RolloutScheduler, Score
from gyre.sim.engine import SimEngine
from gyre.sim.services import SimEnvs, SimRewards

INF = float("inf")


class RolloutStalled(RuntimeError):
    """Nothing is left to happen and the caller's condition does not hold (e.g. too few groups admitted)."""


@dataclass
class SimCluster:
    engines: list[SimEngine | None]
    """Rollout engines by rank; None where an engine has left."""
    rewards: SimRewards
    envs: SimEnvs | None = None
    now: float = 0.0
    schedulers: dict[str, RolloutScheduler] = field(default_factory=dict)
    events: int = 0
    """Event times processed (for the simulator's own speed)."""
    _heap: list = field(default_factory=list)
    _stamp: list[int] = field(default_factory=list)
    _timers: list = field(default_factory=list)
    """(time, seq, action): things that happen at a set time (an engine joining or leaving)."""
    _timer_seq: int = 0
    _busy: dict[int, float] = field(default_factory=dict)
    """Engine rank -> its busy seconds at the last ``busy_seconds`` call."""

    def __post_init__(self) -> None:
        self._stamp = [0] * len(self.engines)

    # ---- the port (gyre.rollout.port.RolloutPort) -------------------------------------------------------
    @property
    def engine_count(self) -> int:
        return len(self.engines)

    def load_weights(self, version: int, weights, partial: bool) -> None:
        """Every engine takes ``version`` at its next step boundary (each pays the sync on its own clock;
        simulated weights are only a version)."""
        self.publish(version, partial)

    def release(self, scheduler: RolloutScheduler) -> None:
        self.schedulers.pop(scheduler.spec.stream, None)

    def busy_seconds(self) -> list[float]:
        """Seconds each engine in the pool spent prefilling and decoding since the last call."""
        out = []
        for rank, engine in enumerate(self.engines):
            if engine is None:  # left the pool: the list stays indexed by rank
                out.append(0.0)
                continue
            out.append(engine.busy_s - self._busy.get(rank, 0.0))
            self._busy[rank] = engine.busy_s
        return out

    def close(self) -> None:
        """Nothing to end: the simulated engines need no stream."""

    # ---- commands -----------------------------------------------------------------------------------
    def send(self, commands: list) -> None:
        adds: dict[int, list] = {}
        for command in commands:
            if isinstance(command, Generate):
                adds.setdefault(command.engine, []).extend(command.requests)
            elif isinstance(command, Abort):
                self._add(adds)
                for rank, ids in command.by_engine.items():
                    engine = self._catch_up(self._engine(rank))
                    self._deliver(engine.abort(ids))
                    self._touch(rank)
            elif isinstance(command, Score):
                self.rewards.submit(command.trajectories, self.now)
            elif isinstance(command, EnvCall):
                self.envs.submit(command, self.now)
            else:
                raise TypeError(f"unknown rollout command {command!r}")
        self._add(adds)

    def _add(self, adds: dict[int, list]) -> None:
        for rank, requests in adds.items():
            self._catch_up(self._engine(rank)).add(requests)
            self._touch(rank)
        adds.clear()

    def _catch_up(self, engine: SimEngine) -> SimEngine:
        """Bring ``engine`` to the clock before a command reaches it: what it finished by now is delivered
        (an idle engine's clock just moves); the command then takes effect at its next step boundary."""
        self._deliver(engine.advance(self.now))
        return engine

    def _engine(self, rank: int) -> SimEngine:
        engine = self.engines[rank]
        if engine is None:
            raise RuntimeError(f"the scheduler sent work to rollout engine {rank}, which has left the pool")
        return engine

    def _touch(self, rank: int) -> None:
        """Engine ``rank``'s state changed: its next event goes (back) on the heap."""
        self._stamp[rank] += 1
        engine = self.engines[rank]
        if engine is not None:
            t = engine.next_event()
            if t < INF:
                heapq.heappush(self._heap, (max(t, self.now), rank, self._stamp[rank]))

    # ---- the loop -----------------------------------------------------------------------------------
    def run(self, scheduler: RolloutScheduler, done: Callable[[], bool], label: str = "train",
            refill: Callable[[], None] | None = None, until: float | None = None) -> PhaseTimes:
        """Process events until ``done()``, or until the clock reaches ``until`` (it then stands there);
        virtual seconds until nothing was left to generate, and scoring after that."""
        self.schedulers[scheduler.spec.stream] = scheduler
        until = INF if until is None else until
        start, generated = self.now, None
        self._flush(refill)
        while not done():
            if generated is None and not scheduler.outstanding:
                generated = self.now
            t = min(self._next_engine(), self.rewards.next_event(),
                    self.envs.next_event() if self.envs is not None else INF,
                    self._timers[0][0] if self._timers else INF)
            if t > until:
                self.now = max(self.now, until)
                break
            if t == INF:
                raise RolloutStalled(f"the simulated rollout went idle before the batch was complete ({label})")
            self.now = max(self.now, t)
            self.events += 1
            while self._timers and self._timers[0][0] <= self.now:
                heapq.heappop(self._timers)[2]()
            self._engine_events()
            scored = self.rewards.due(self.now)
            if scored:
                for s in list(self.schedulers.values()):
                    s.on_scored(scored)
            if self.envs is not None:
                answers = self.envs.due(self.now)
                if answers:
                    for name, results in _by_stream(answers, lambda r: r.call_id).items():
                        if name in self.schedulers:
                            self.schedulers[name].on_env(results)
            self._flush(refill)
        generated = self.now if generated is None else generated
        return PhaseTimes(generated - start, self.now - generated)

    def _flush(self, refill: Callable[[], None] | None) -> None:
        if refill is not None:
            refill()
        for s in list(self.schedulers.values()):
            self.send(s.drain())

    def _next_engine(self) -> float:
        while self._heap and self._heap[0][2] != self._stamp[self._heap[0][1]]:
            heapq.heappop(self._heap)  # superseded by a later change of the engine
        return self._heap[0][0] if self._heap else INF

    def _engine_events(self) -> None:
        while self._next_engine() <= self.now:
            _, rank, _ = heapq.heappop(self._heap)
            engine = self.engines[rank]
            self._deliver(engine.advance(self.now))
            self._touch(rank)

    def _deliver(self, results: list) -> None:
        for name, part in _by_stream(results, lambda r: r.request_id).items():
            if name in self.schedulers:  # a finished scheduler's late samples are dropped
                self.schedulers[name].on_generated(part)

    def at(self, t: float, action: Callable[[], None]) -> None:
        """Run ``action`` when the clock reaches ``t`` (during a ``run``)."""
        self._timer_seq += 1
        heapq.heappush(self._timers, (t, self._timer_seq, action))

    def hold(self, until: float) -> None:
        """The rollout devices are lent to training until ``until`` (colocation): engines stop there."""
        for rank, engine in enumerate(self.engines):
            if engine is None:
                continue
            self._catch_up(engine).now = max(engine.now, until)
            self._touch(rank)
        self.now = max(self.now, until)

    # ---- weight updates and elastic capacity ----------------------------------------------------------
    def publish(self, version: int, partial: bool) -> None:
        """Every engine takes ``version`` at its next step boundary (each pays the sync on its own clock)."""
        for rank, engine in enumerate(self.engines):
            if engine is None:
                continue
            self._deliver(self._catch_up(engine).update(version, partial))
            self._touch(rank)

    def join(self, engine: SimEngine) -> int:
        """A new engine (lent serving capacity, a spot instance) joins; returns its rank."""
        self._catch_up(engine)  # a fresh engine's clock starts now
        self.engines.append(engine)
        self._stamp.append(0)
        rank = len(self.engines) - 1
        for s in self.schedulers.values():
            s.on_engine_joined(rank)
        return rank

    def leave(self, rank: int, hand_back: bool = True) -> None:
        """Engine ``rank`` leaves: with ``hand_back`` (a warning came in time) its samples' tokens so far
        come back and continue elsewhere; without, they are regenerated from scratch."""
        engine = self._catch_up(self._engine(rank))  # samples that finished by now are delivered, not re-asked
        held = engine.abort(engine.request_ids()) if hand_back else []
        self.engines[rank] = None
        self._stamp[rank] += 1
        for s in self.schedulers.values():
            s.on_engine_lost(rank, [r for r in held if r.request_id.split("-")[0] == s.spec.stream])
        self._flush(None)


def _by_stream(items, request_id) -> dict[str, list]:
    out: dict[str, list] = {}
    for item in items:
        out.setdefault(request_id(item).split("-")[0], []).append(item)
    return out
