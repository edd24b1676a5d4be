"""The rollout IO loop over Ray actors: the one place that waits on rollout engines and reward workers together.

The real ``RolloutPort`` (``gyre.rollout.port``; the simulator's is ``gyre.sim.cluster.SimCluster``).

Each engine serves one stream for the whole run (``EngineHost.serve``): finished samples come back on it
as they finish. The driver carries out the scheduler's commands (``Generate``: add requests to an engine;
``Abort``; ``Score``: hand trajectories to the reward pool), and turns what comes back (samples from the
streams, rewards from the pool) into the scheduler's events, until the caller's condition holds. It can
also wait on other refs meanwhile (a training call), so rollout goes on while the learner works.

A dead engine, or one that hands back nothing for longer than the watchdog's deadline while it owes
samples, is replaced in place when the driver has a ``restore`` (its samples asked of the others);
without one (hybrid engines are policy ranks) it raises ``RoleFault`` (role, rank, cause).

With elastic capacity (``gyre.rollout.elastic``) lent engines join and leave between events: a joining
one becomes the group's next rank and every scheduler's (``on_engine_joined``); a leaving one drains,
hands back what it holds and leaves its rank vacant (``on_engine_draining``, ``on_engine_lost``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from gyre.cluster import transport
from gyre.cluster.channel import ChannelPublication
from gyre.cluster.faults import CallClock, RoleFault, fault_from
from gyre.cluster.group import Method, RoleGroup
from gyre.cluster.workers import SERVE, EngineHost, RolloutWorker
from gyre.envs.calls import EnvCall
from gyre.rollout.elastic import POLL_S, LentEngines
from gyre.rollout.port import PhaseTimes
from gyre.rollout.requests import Abort, Generate
from gyre.rollout.scheduler import RolloutScheduler, Score
from gyre.types import WeightVersion

log = logging.getLogger(__name__)

_MAX_HANGS_PER_ENGINE = 3
"""In-place replacements of hung engines a run allows, per engine, before a hang is the run's fault."""


@dataclass(frozen=True)
class CallWait:
    """What a run waits for besides the rollout: ``refs`` of a call of ``method`` on ``group`` (the
    learner's), within that call's deadline."""

    refs: tuple
    group: RoleGroup
    method: Method


class RolloutDriver:
    def __init__(self, engines: RoleGroup, rewards, emit_every: int = 1, emit_after_s: float = 0.05,
                 replaceable: bool = False, envs=None, elastic: LentEngines | None = None):
        """``rewards``: the reward pool (``gyre.cluster.reward_pool.RewardPool``). Engines hand finished
        samples back ``emit_every`` at a time or ``emit_after_s`` after the first (fewer, larger reward calls).
        ``replaceable``: a dead or hung engine is replaced in place by a fresh one holding the current
        weights (not hybrid engines, which are policy ranks: their death is the run's fault, recovered from
        a checkpoint); else an engine fault is raised. ``elastic``: lent engines that come and go."""
        self.engines = engines
        self.restore = self._restore if replaceable and engines.spawn else None
        self.engine_deaths = 0
        """Engines that died and were replaced in place."""
        self.engine_hangs = 0
        """Engines replaced in place because they stopped handing back samples."""
        self.rewards = rewards
        self.envs = envs
        """The environment pool of multi-turn runs (``gyre.cluster.env_pool.EnvPool``), else None."""
        self.emit_every, self.emit_after_s = emit_every, emit_after_s
        self._streams: dict = {}
        """Each engine's serve stream -> its rank."""
        self._heard: dict[int, float] = {}
        """Busy engine -> when it last handed back samples (or became busy): its silence is timed from there."""
        self.schedulers: dict[str, RolloutScheduler] = {}
        """Every scheduler with work on the engines, by the stream name that prefixes its request ids."""
        self._held: tuple[WeightVersion, object] = (0, None)
        """The version and weights the engines hold (or are being given): what a replacement engine gets."""
        self._partial = True
        self.channel_fallbacks = 0
        """Weight versions sent through the object store because their weight channel lost a member."""
        self.elastic = elastic
        self.base = len(engines)
        """The base pool's engines (ranks 0..base-1): the weight channel's members; lent ones come after."""
        if elastic is not None:
            elastic.driver = self

    @property
    def engine_count(self) -> int:
        return len(self.engines)

    def run(self, scheduler: RolloutScheduler, done: Callable[[], bool], label: str = "train",
            refill: Callable[[], None] | None = None, until: CallWait | None = None) -> PhaseTimes:
        """Carry out ``scheduler``'s commands and every command they lead to until ``done()`` (or, with
        ``until``, until its refs are ready, returning early; the deadline of the call they belong to
        applies). ``refill()`` may admit more after each event (queue scheduling admits as capacity frees).
        ``label`` keys the watchdog's usual durations."""
        times = PhaseTimes()
        if until is not None and not until.refs:  # nothing to wait for: no event could end the loop
            return times
        self._open()
        self.enlist(scheduler)
        t0 = time.perf_counter()
        self.send(scheduler.drain())
        clock = CallClock(self.engines.watchdog, self.engines.name, f"generate({label})")
        refs = list(until.refs) if until is not None else []
        waited = CallClock(until.group.watchdog, until.group.name, transport.method_name(until.method)) \
            if until is not None else None
        while not done():
            if refs and not transport.wait(refs, num_returns=len(refs), timeout=0)[1]:
                break
            if waited is not None and waited.expired():
                pending = transport.wait(refs, num_returns=len(refs), timeout=0)[1]
                raise waited.hung(until.group.actors, [i for i, r in enumerate(refs) if r in pending])
            busy = sorted({e for s in self.schedulers.values() for e in s.busy_engines()})
            if self.restore is not None:
                self._replace_silent(busy, clock.deadline_s)
            elif busy and clock.expired() and not refs:
                raise clock.hung(self.engines.actors, busy)
            if self.elastic is not None:
                self.elastic.tick()
            self._events(min(clock.slice(), POLL_S) if self.elastic is not None else clock.slice(), refs)
            if refill is not None:
                refill()
            for s in self.schedulers.values():
                self.send(s.drain())
            clock.tick()
            if not scheduler.outstanding and not times.generate:
                times.generate = time.perf_counter() - t0
            if not scheduler.outstanding and not self.rewards.busy and not done() and not refs:
                raise RuntimeError("the rollout went idle before the batch was complete (too few groups admitted)")
        clock.done()
        times.generate = times.generate or time.perf_counter() - t0
        times.reward = time.perf_counter() - t0 - times.generate
        return times

    def send(self, commands: list) -> None:
        """Carry out commands in order; an engine's ``Generate`` commands go as one call (requests asked
        together start together: which requests share a decoding step must not depend on timing)."""
        adds: dict[int, list] = {}
        for command in commands:
            if isinstance(command, Generate):
                adds.setdefault(command.engine, []).extend(command.requests)
                continue
            if isinstance(command, Abort):
                self._add(adds)  # an abort follows the requests it names
                for engine, ids in command.by_engine.items():
                    if self._serves(engine):
                        self.engines.submit_to(engine, EngineHost.abort, list(ids))
            elif isinstance(command, Score):
                self.rewards.submit(list(command.trajectories))
            elif isinstance(command, EnvCall):
                self.envs.submit(command)
            else:
                raise TypeError(f"unknown rollout command {command!r}")
        self._add(adds)

    def _add(self, adds: dict[int, list]) -> None:
        for engine, requests in adds.items():
            if self._serves(engine):
                self.engines.submit_to(engine, EngineHost.add, requests)
        adds.clear()

    def _serves(self, engine: int) -> bool:
        """The rank still holds an engine. A command queued for a lent engine that left in the same event
        round goes nowhere: the scheduler already asked the others for what that engine owed."""
        return self.engines.actors[engine] is not None

    def load_weights(self, version: WeightVersion, weights, partial: bool) -> None:
        """Give every engine ``version`` (``weights``: a ``WeightBundle`` ref list; for hybrid engines, the
        policy's own ranks, None: only the stamp moves). An engine that dies or hangs meanwhile is replaced
        by a fresh one holding it (when engines are replaceable), then every engine is asked once more."""
        self._held, self._partial = (version, weights), partial
        if isinstance(weights, ChannelPublication):
            if self._load_from_channel(version, weights, partial):
                return
            weights = weights.store_refs()
        if self.elastic is not None:
            self.elastic.tick()
        try:
            versions = self._update(weights, version, partial)
        except RoleFault as fault:
            lent = [r for r in fault.ranks if r >= self.base and self.elastic is not None]
            if fault.kind == "error" or (self.restore is None and len(lent) < len(fault.ranks)):
                raise
            for rank in fault.ranks:
                if rank in lent:  # a lent engine is not replaced: it leaves
                    self.elastic.died(rank, str(fault))
                else:
                    self.replace(rank, fault)
            versions = self._update(weights, version, partial)
        _check_versions(versions, version)

    def _update(self, weights, version: WeightVersion, partial: bool) -> list:
        """Every live engine takes ``version`` from ``weights``."""
        group = self.engines
        ranks = group.live
        refs = [group.submit_to(rank, EngineHost.update_weights, weights, version, partial) for rank in ranks]
        return group.gather(refs, EngineHost.update_weights, ranks=ranks)

    def _load_from_channel(self, version: WeightVersion, publication: ChannelPublication, partial: bool) -> bool:
        """``version`` over the weight channel. A member that fails (an engine dies, hangs or refuses a bucket;
        the sender misses its deadline) ends the channel's generation on every member: False, and the caller
        sends the version through the object store (replacing a lost engine); the next publication builds
        a new generation, with every engine."""
        group = self.engines
        base = [r for r in group.live if r < self.base]
        lent = [r for r in group.live if r >= self.base]
        stored = publication.store_refs() if lent else None  # first: its host copy must not hold up the broadcast
        weights, sender = publication.start()
        lent_refs = [group.submit_to(r, EngineHost.update_weights, stored, version, partial) for r in lent]
        try:  # the channel's members (the base pool) alone: a lent engine's failure is not the channel's
            refs = [group.submit_to(r, EngineHost.update_weights, weights, version, partial) for r in base]
            versions = group.gather(refs, EngineHost.update_weights, ranks=base)
            publication.sent(sender)
        except RoleFault as fault:
            if fault.role != self.engines.name and fault.kind == "died":
                raise  # the sender (the policy's rank 0) is lost: the run's fault
            self.channel_fallbacks += 1
            log.warning("%s; weight version %d goes through the object store instead, and the next one over a "
                        "new weight channel", fault, version)
            publication.failed(weights)
            for rank in [r for r in self.engines.live if r < self.base]:  # free engines still waiting for a bucket
                self.engines.submit_to(rank, RolloutWorker.abort_weights, weights.spec.generation, probe=True)
            return False
        for rank, ref in zip(lent, lent_refs):
            try:
                versions += group.gather([ref], EngineHost.update_weights, ranks=[rank])
            except RoleFault as fault:
                if fault.kind == "error":
                    raise
                self.elastic.died(rank, str(fault))
        _check_versions(versions, version)
        return True

    def release(self, scheduler: RolloutScheduler) -> None:
        self.schedulers.pop(scheduler.spec.stream, None)

    def busy_seconds(self) -> list[float]:
        """Seconds each engine spent decoding since the last call."""
        group = self.engines
        refs = [group.submit_to(rank, EngineHost.busy_seconds, probe=True) for rank in group.live]
        return group.gather(refs, EngineHost.busy_seconds, ranks=group.live)

    def close(self) -> None:
        """End the serve streams (the actors live on; lent engines still starting are stopped)."""
        if self.elastic is not None:
            self.elastic.close()
        if self._streams:
            self.engines.call(EngineHost.stop_serving)
            self._streams.clear()

    def _restore(self, rank: int) -> None:
        """A fresh engine for ``rank``, loaded (it may start offloaded) and given the current weights."""
        group, (version, weights) = self.engines, self._held
        weights = self.store_weights(weights)  # a fresh engine is not in the channel's generation
        group.respawn(rank)
        group.gather([group.submit_to(rank, RolloutWorker.reload)], RolloutWorker.reload, ranks=[rank])
        if weights is None:  # nothing published yet: a fresh engine holds the initial weights, as its peers do
            held = group.gather([group.submit_to(rank, RolloutWorker.weight_version)], RolloutWorker.weight_version,
                                ranks=[rank])
        else:
            held = group.gather([group.submit_to(rank, EngineHost.update_weights, weights, version, self._partial)],
                                EngineHost.update_weights, ranks=[rank])
        if held != [version]:
            raise RuntimeError(f"a replacement {group.name} engine reports version {held}, expected {version}")

    # ---- what elastic capacity asks ---------------------------------------------------------------
    @property
    def held(self) -> tuple[WeightVersion, object]:
        """The version and weights the engines hold: what a joining engine takes first."""
        return self._held

    @property
    def partial(self) -> bool:
        return self._partial

    @staticmethod
    def store_weights(weights):
        """``weights`` as object-store refs (a publication over the channel is fetched from the sender)."""
        return weights.store_refs() if isinstance(weights, ChannelPublication) else weights

    def serving(self, rank: int) -> bool:
        return rank in self._streams.values()

    def joined(self, rank: int) -> None:
        """Engine ``rank`` joined the group: it serves, and every scheduler may send it requests."""
        if self._streams:
            self._streams[self._serve(rank)] = rank
        for s in self.schedulers.values():
            s.on_engine_joined(rank)

    def draining(self, rank: int) -> None:
        for s in self.schedulers.values():
            s.on_engine_draining(rank)

    def lost(self, rank: int, handed_back: list) -> None:
        """Engine ``rank`` left the group (its rank stays vacant): each scheduler asks what it owed of the
        others, continuing the samples among ``handed_back`` from their tokens."""
        for stream in [s for s, r in self._streams.items() if r == rank]:
            del self._streams[stream]
        self._heard.pop(rank, None)
        for s in self.schedulers.values():
            s.on_engine_lost(rank, [r for r in handed_back if r.request_id.split("-")[0] == s.spec.stream])
        self.engines.vacate(rank)

    def deliver(self, results: list) -> None:
        """Engine results to the schedulers whose streams they belong to."""
        by_stream: dict[str, list] = {}
        for result in results:
            by_stream.setdefault(result.request_id.split("-")[0], []).append(result)
        for name, mine in by_stream.items():
            if name in self.schedulers:  # a finished scheduler's late samples are dropped
                self.schedulers[name].on_generated(mine)

    def await_joins(self) -> None:
        """Carry the rollout on until no lent engine is starting, for at most rollout.elastic.join_timeout_s,
        and not past a start that failed (its replacement is not waited for)."""
        if self.elastic is None:
            return
        self._open()
        self.elastic.tick()  # starts what the capacity now asks for
        deadline, failures = time.monotonic() + self.elastic.join_timeout_s, self.elastic.join_failures
        while self.elastic.joining and time.monotonic() < deadline and self.elastic.join_failures == failures:
            self._events(POLL_S, [])
            for s in self.schedulers.values():
                self.send(s.drain())
            self.elastic.tick()

    # ---- internals ------------------------------------------------------------------------------
    def enlist(self, scheduler: RolloutScheduler) -> None:
        """Register ``scheduler``, telling it of engines that joined or left since it was made."""
        self.schedulers[scheduler.spec.stream] = scheduler
        while scheduler.engines < len(self.engines):
            scheduler.on_engine_joined(scheduler.engines)
        leaving = self.elastic.leaving if self.elastic is not None else {}
        for rank in range(len(self.engines)):
            if (self.engines.actors[rank] is None or rank in leaving) and rank not in scheduler.requests.down:
                scheduler.on_engine_lost(rank)

    def _open(self) -> None:
        if not self._streams:
            for rank in self.engines.live:
                self._streams[self._serve(rank)] = rank

    def _events(self, timeout: float, until: list) -> None:
        """Wait up to ``timeout`` for samples, rewards or ``until``; feed what arrived to the schedulers."""
        env_refs = self.envs.refs() if self.envs is not None else []
        joining = self.elastic.refs() if self.elastic is not None else []
        watched = [*self._streams, *self.rewards.refs(), *env_refs, *joining, *until]
        ready, _ = transport.wait(watched, num_returns=1, timeout=timeout)
        rest = [r for r in watched if r not in ready]
        if ready and rest:  # everything else that is in as well, before judging any deadline
            ready += transport.wait(rest, num_returns=len(rest), timeout=0)[0]
        for stream in [r for r in ready if r in self._streams]:
            rank = self._streams[stream]
            if rank in self._heard:
                self._heard[rank] = time.monotonic()
            leaving = self.elastic is not None and rank in self.elastic.leaving
            try:
                part = self._next(stream)
            except RoleFault as fault:
                if leaving:  # its stream ended as asked (or it died on its way out)
                    self.elastic.ended(rank)
                elif fault.kind != "died" or self.restore is None:
                    raise
                else:
                    self.replace(rank, fault)
                continue
            self.deliver(self.elastic.sort(rank, part) if leaving else part)
        for ref in [r for r in ready if r in set(joining)]:
            self.elastic.on_ready(ref)
        if self.envs is not None:
            asked = set(env_refs)
            self._env_answers([r for r in ready if r in asked])
        scored = self.rewards.poll(0)
        if scored:
            for s in self.schedulers.values():
                s.on_scored(scored)

    def _env_answers(self, ready: list) -> None:
        """Environment answers (and failures past their deadline) to the schedulers whose episodes asked."""
        by_stream: dict[str, list] = {}
        for result in self.envs.poll(ready):
            by_stream.setdefault(result.call_id.split("-")[0], []).append(result)
        for name, results in by_stream.items():
            if name in self.schedulers:
                self.schedulers[name].on_env(results)

    def _replace_silent(self, busy: list[int], deadline_s: float) -> None:
        """Replace every engine that owes samples and has handed back none for ``deadline_s`` (stopped,
        frozen, or wedged): a hang costs its samples' progress, not the run."""
        now = time.monotonic()
        self._heard = {rank: self._heard.get(rank, now) for rank in busy}
        for rank in [r for r in busy if now - self._heard[r] > deadline_s]:
            fault = RoleFault(self.engines.name, (rank,), "serve", "hung",
                              f"handed back no sample for {now - self._heard[rank]:.0f} s while owing some "
                              f"(deadline {deadline_s:.0f} s)")
            self.engine_hangs += 1
            if self.engine_hangs > _MAX_HANGS_PER_ENGINE * len(self.engines):
                raise fault  # systemic (the deadline is too tight, or every fresh engine hangs)
            self.replace(rank, fault)

    def replace(self, rank: int, fault: RoleFault) -> None:
        """Engine ``rank`` is lost: the schedulers ask its samples of the others, a fresh engine with the
        current weights takes its place (and serves again, when the streams are open). A lent engine is
        not replaced: its capacity is gone."""
        if self.elastic is not None and rank in self.elastic.lent:
            self.elastic.died(rank, str(fault))
            return
        stream = next((s for s, r in self._streams.items() if r == rank), None)
        serving = bool(self._streams)
        if stream is not None:
            del self._streams[stream]
        self._heard.pop(rank, None)
        for s in self.schedulers.values():
            s.on_engine_lost(rank)
        if fault.kind == "died":
            self.engine_deaths += 1
        log.warning("%s; asked its samples of the other engines and started a fresh one", fault)
        self.restore(rank)
        if serving:
            self._streams[self._serve(rank)] = rank
        for s in self.schedulers.values():
            s.on_engine_back(rank)

    def _serve(self, rank: int):
        return self.engines.submit_to(rank, EngineHost.serve, self.emit_every, self.emit_after_s, lane=SERVE)

    def _next(self, stream) -> list:
        rank = self._streams[stream]
        try:
            part = transport.next_part(stream)
        except transport.RemoteError as exc:
            raise fault_from(exc, self.engines.name, rank, "serve") from None
        if part is transport.STREAM_END:
            raise fault_from(RuntimeError("its serve stream ended"), self.engines.name, rank, "serve")
        return part


def _check_versions(versions: list, version: WeightVersion) -> None:
    if any(v != version for v in versions):
        raise RuntimeError(f"weight sync failed: rollout workers report versions {versions}, expected {version}")
