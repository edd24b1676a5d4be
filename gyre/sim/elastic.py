"""Elastic and preemptible rollout capacity on the simulated cluster (ROSE, Spotlight: ``systems.md`` 5, 6).

Besides the layout's rollout engines (the base pool, always there), ``lent`` engines come and go at run
time, each by its own on/off process: serving capacity lent to training between traffic bursts (ROSE), or
spot instances reclaimed and replaced (Spotlight). A leaving engine either hands back the tokens its
samples hold, so other engines continue them (a warning came: ``warning_s``), or vanishes with them, so
they are regenerated. Joining engines load the current weights first.

Only the capacity is simulated: what happens to the requests of a leaving engine, and where new requests
go, is decided by the real ``RolloutScheduler`` (``on_engine_joined``, ``on_engine_draining``,
``on_engine_lost``), the same code a real elastic pool would run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gyre.sim.engine import SimEngine

if TYPE_CHECKING:  # the run imports this module
    from gyre.sim.run import SimRun


@dataclass(frozen=True)
class ElasticSpec:
    """Rollout engines that join and leave at run time, on top of the layout's (the base pool)."""

    lent: int
    """Engines that come and go, each by its own on/off process."""
    on_s: float
    """Mean seconds a lent engine stays once joined (exponential; notice period included)."""
    off_s: float
    """Mean seconds it is away before it (or a replacement) joins again (exponential)."""
    warning_s: float | None = 0.0
    """Notice before an engine leaves. None: none (a spot instance killed outright): the tokens its samples
    hold are lost and they are regenerated elsewhere. 0: it hands them back as it leaves (ROSE's emergency
    cut: aborted and re-routed) and other engines continue them. Above 0: for that long it gets no new
    work and decodes on, then hands back what is left."""
    join_s: float | None = None
    """Seconds a joining engine takes to load the weights before it serves (None: the cost model's
    ``join_s``, through the object store as a replacement engine loads them)."""
    seed: int = 0
    """Seeds the on/off processes (each lent engine its own stream: the plan does not depend on the run)."""

    def __post_init__(self) -> None:
        if self.lent < 0 or self.on_s <= 0 or self.off_s < 0:
            raise ValueError(f"elastic capacity needs lent >= 0, on_s > 0 and off_s >= 0, got {self}")
        if self.warning_s is not None and self.warning_s < 0:
            raise ValueError(f"warning_s is None (no notice) or >= 0, got {self.warning_s}")

    @property
    def duty(self) -> float:
        """Share of the time a lent engine is in the pool."""
        return self.on_s / (self.on_s + self.off_s)

    def mean_engines(self, base: int) -> float:
        """Mean pool size over a long run, ``base`` engines always there."""
        return base + self.lent * self.duty


@dataclass
class ElasticPool:
    """The on/off processes of one run's lent engines, driven by the cluster's timers (``install``)."""

    spec: ElasticSpec
    run: SimRun
    ranks: list[int | None] = field(default_factory=list)
    """Each lent slot's engine rank while it is in the pool (None while away)."""
    gone: list[SimEngine] = field(default_factory=list)
    """Engines that left (their work done still counts)."""
    joins: int = 0
    leaves: int = 0
    tokens_lost: int = 0
    """Tokens left engines held and could not hand back (regenerated elsewhere)."""
    timeline: list[tuple[float, int]] = field(default_factory=list)
    """(time, engines in the pool from then on)."""
    _rng: list[random.Random] = field(default_factory=list)

    def start(self) -> None:
        """Each slot starts in the pool with probability ``duty`` (the stationary state), else away."""
        s = self.spec
        self._rng = [random.Random(f"elastic/{s.seed}/{slot}") for slot in range(s.lent)]
        self.ranks = [None] * s.lent
        self._mark()
        for slot, rng in enumerate(self._rng):
            if rng.random() < s.duty:
                self._join(slot, warm=True)
            else:
                self._after(rng.expovariate(1 / s.off_s) if s.off_s else 0.0, lambda slot=slot: self._join(slot))

    @property
    def cluster(self):
        return self.run.cluster

    def _after(self, seconds: float, action) -> None:
        self.cluster.at(self.cluster.now + seconds, action)

    def _mark(self) -> None:
        live = sum(e is not None for e in self.cluster.engines)
        self.timeline.append((self.cluster.now, live))

    def _join(self, slot: int, warm: bool = False) -> None:
        """A lent engine joins holding the current weights (``warm``: it was there from the start)."""
        engine = self.run.new_engine()
        engine.load_weights(None, self.run.scheduler.version)
        load_s = 0.0 if warm else (self.spec.join_s if self.spec.join_s is not None else self.run.spec.cost.join_s())
        engine.now = self.cluster.now + load_s  # it serves once the weights are in
        self.ranks[slot] = self.cluster.join(engine)
        self.joins += 1
        self._mark()
        stay = self._rng[slot].expovariate(1 / self.spec.on_s)
        if self.spec.warning_s:  # the notice comes ``warning_s`` before it goes (at once if it stays less)
            self._after(max(0.0, stay - self.spec.warning_s), lambda: self._notice(slot))
        self._after(stay, lambda: self._leave(slot))

    def _notice(self, slot: int) -> None:
        """Its capacity will be taken back: it gets no new work from now on and decodes on until it goes."""
        for s in self.cluster.schedulers.values():
            s.on_engine_draining(self.ranks[slot])

    def _leave(self, slot: int) -> None:
        rank = self.ranks[slot]
        engine = self.cluster.engines[rank]
        hand_back = self.spec.warning_s is not None
        self.cluster.leave(rank, hand_back=hand_back)
        if not hand_back:  # what it held is gone (the scheduler keeps only the parts handed back earlier)
            self.tokens_lost += sum(len(r.response_ids) for r in engine.abort(engine.request_ids()))
        self.gone.append(engine)
        self.ranks[slot] = None
        self.leaves += 1
        self._mark()
        off = self._rng[slot].expovariate(1 / self.spec.off_s) if self.spec.off_s else 0.0
        self._after(off, lambda: self._join(slot))

    def mean_engines(self, start: float, end: float) -> float:
        """Time-weighted engines in the pool over [start, end] (what the run actually had)."""
        total, points = 0.0, [*self.timeline, (float("inf"), 0)]
        for (t, live), (t_next, _) in zip(points, points[1:], strict=False):
            lo, hi = max(t, start), min(t_next, end)
            if hi > lo:
                total += live * (hi - lo)
        return total / max(end - start, 1e-9)

    @property
    def busy_s(self) -> float:
        """Seconds every engine, gone or present, spent prefilling and decoding."""
        return sum(e.busy_s for e in [*self.gone, *(e for e in self.cluster.engines if e is not None)])


def install(spec: ElasticSpec, run: SimRun) -> ElasticPool:
    """Put ``spec``'s lent engines on ``run``'s cluster: the initially present ones join now, the rest (and
    every later join and leave) by timers on the virtual clock."""
    pool = ElasticPool(spec, run)
    pool.start()
    return pool
