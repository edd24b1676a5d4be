"""Lent rollout engines in a real run: started, given the weights, announced, drained and taken back.

The IO half of elastic capacity (``gyre.rollout.capacity`` decides how many; this carries it out), run by
the rollout driver between events. A lent engine is a rollout actor started outside the run's device
reservation (``start``); it first takes the weights the pool holds (through the object store, as a
replacement engine does: it is not in the weight channel's generation, which stays the base pool), and
again if a newer version was published while it started; then it joins the group as its next rank, its
serve stream opens, and every scheduler hears ``on_engine_joined``.

Taking one back: with a notice, the schedulers hear ``on_engine_draining`` (nothing new goes to it) and
it decodes on until it owes nothing or the notice ends; then its loop stops, the stream hands back the
tokens its unfinished samples hold (``finish_reason`` "abort"), and the schedulers hear ``on_engine_lost``
with them, so other engines continue those samples. Without one (a spot instance killed outright), it is
killed and its samples are regenerated from their seeds. A lent engine that dies is taken back the same
way and not replaced (the capacity's target drops with it) until the schedule or an operator asks again.
Every wait has a deadline: a start that misses ``join_timeout_s`` is given up (the pool asks for another,
backing off while starts keep failing), a stopping engine whose stream does not end in ``_STOP_GRACE_S``
is killed and treated as gone without notice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gyre.cluster import transport
from gyre.cluster.workers import EngineHost, RolloutWorker
from gyre.rollout.capacity import Capacity
from gyre.types import GenerationResult, WeightVersion

if TYPE_CHECKING:  # the driver imports this module
    from gyre.rollout.driver import RolloutDriver

log = logging.getLogger(__name__)

_STOP_GRACE_S = 60.0
"""How long a stopping engine's stream may take to hand back what it holds and end."""

POLL_S = 0.5
"""The driver's longest wait between looks at the capacity (an operator's lend / reclaim, a notice's end)."""
_BACKOFF_S = 60.0
"""Longest wait before starting another lent engine after starts failed in a row (doubling from 1 s)."""


@dataclass
class _Joining:
    actor: Any
    ref: Any
    """Its pending call: the weight update (or, before any publication, the version it holds)."""
    version: WeightVersion
    """The version that call gives it."""
    deadline: float


@dataclass
class _Leaving:
    stop_at: float
    """When its notice ends (it is stopped then, or as soon as it owes nothing)."""
    stopped_at: float | None = None
    """When its loop was asked to stop (its stream then ends)."""
    handed_back: list[GenerationResult] = field(default_factory=list)


class LentEngines:
    def __init__(self, capacity: Capacity, start: Callable[[], Any], join_timeout_s: float):
        """``start()`` starts one lent rollout actor (it loads the model in the background)."""
        self.capacity = capacity
        self.start_engine = start
        self.join_timeout_s = join_timeout_s
        self.driver: RolloutDriver | None = None
        self.lent: list[int] = []
        """Ranks of the lent engines in the pool (leaving ones included), in join order."""
        self.joining: dict[Any, _Joining] = {}
        self.leaving: dict[int, _Leaving] = {}
        self.joins = self.leaves = self.join_failures = 0
        self.tokens_handed_back = 0
        """Tokens leaving engines handed back (continued by other engines, not regenerated)."""
        self.samples_orphaned = 0
        """Samples whose engine left without handing them back (regenerated from their seeds)."""
        self._engine_s = 0.0
        self._since: float | None = None
        """When the pool's size last changed (None: not yet counted)."""
        self._failed_in_a_row = 0
        self._start_after = 0.0
        """No start before then (monotonic seconds): starts that keep failing back off."""

    # ---- what the driver asks ---------------------------------------------------------------------
    def refs(self) -> list:
        """Calls of starting engines, for the driver to wait on with its other refs."""
        return list(self.joining)

    def tick(self) -> None:
        """Give up starts past their deadline, stop leaving engines whose notice ended (or that owe nothing),
        then bring the pool toward the capacity's target."""
        now = time.monotonic()
        if self._since is None:
            self._since = now
        for ref, joining in list(self.joining.items()):
            if now > joining.deadline:
                self._give_up(ref, f"it did not start and take the weights within {self.join_timeout_s:.0f} s "
                                   "(rollout.elastic.join_timeout_s)")
        for rank, leaving in list(self.leaving.items()):
            if leaving.stopped_at is None and (now >= leaving.stop_at or not self._owes(rank)):
                self._stop(rank)
            elif leaving.stopped_at is not None and now - leaving.stopped_at > _STOP_GRACE_S:
                log.warning("lent rollout engine %d did not hand back its samples within %.0f s of being stopped: "
                            "killed, its samples regenerated", rank, _STOP_GRACE_S)
                self._gone(rank, handed_back=[])
        self._resize()

    def on_ready(self, ref) -> None:
        """A starting engine's call finished: it joins (or takes a version published meanwhile first)."""
        joining = self.joining.pop(ref)
        driver = self.driver
        try:
            held = transport.get(ref)
        except Exception as exc:  # noqa: BLE001 - a failed start is counted and logged, the run goes on
            self.joining[ref] = joining
            self._give_up(ref, f"{type(exc).__name__}: {transport.translate(exc)}")
            return
        version, weights = driver.held
        if held != version:  # a newer version was published while it started
            self._load(joining, version, weights)
            return
        self.engine_seconds()  # the size changes: count the time at the old one
        self._failed_in_a_row = 0
        rank = driver.engines.attach(joining.actor)
        self.lent.append(rank)
        self.joins += 1
        driver.joined(rank)
        self.capacity.report(self.running, len(self.joining))
        log.info("lent rollout engine %d joined the pool (version %d; %d engines)", rank, version,
                 len(driver.engines.live))

    def ended(self, rank: int) -> None:
        """Leaving engine ``rank``'s stream ended: it handed back what it held."""
        self._gone(rank, self.leaving[rank].handed_back)

    def sort(self, rank: int, part: list[GenerationResult]) -> list[GenerationResult]:
        """A leaving engine's results: once its loop was stopped, its unfinished samples' tokens are kept to
        hand back when it is gone; the rest go on to the schedulers (before the stop, an aborted sample is
        one the scheduler or a weight update stopped, as on any engine)."""
        leaving = self.leaving[rank]
        if leaving.stopped_at is None:
            return part
        leaving.handed_back += [r for r in part if r.finish_reason == "abort"]
        return [r for r in part if r.finish_reason != "abort"]

    def died(self, rank: int, why: str) -> None:
        """Lent engine ``rank`` died (or hung): its capacity is gone (the target drops: not replaced until the
        schedule or an operator asks again), its samples are regenerated."""
        log.warning("lent rollout engine %d is gone (%s): not replaced, its samples are asked of the others", rank, why)
        if rank not in self.leaving:
            self.capacity.lost(1)
        self._gone(rank, handed_back=[])

    def close(self) -> None:
        """The run ends: starting engines are stopped."""
        for ref in list(self.joining):
            transport.kill(self.joining.pop(ref).actor)

    @property
    def running(self) -> int:
        """Engines serving and staying (the base pool and lent ones not leaving)."""
        return len(self.driver.engines.live) - len(self.leaving)

    def engine_seconds(self) -> float:
        """Seconds of engines in the pool (leaving ones included) since the run's first batch: the capacity
        the run had, for comparing pools of different sizes."""
        now = time.monotonic()
        if self._since is not None:
            self._engine_s += (now - self._since) * len(self.driver.engines.live)
        self._since = now
        return self._engine_s

    def metrics(self) -> dict[str, float]:
        return {"rollout/engines": self.running, "rollout/engine_seconds": self.engine_seconds(),
                "rollout/engines_starting": len(self.joining), "elastic/joins": self.joins,
                "elastic/leaves": self.leaves, "elastic/join_failures": self.join_failures,
                "elastic/tokens_handed_back": self.tokens_handed_back,
                "elastic/samples_orphaned": self.samples_orphaned}

    # ---- internals --------------------------------------------------------------------------------
    def _resize(self) -> None:
        change = self.capacity.resize(self.running, len(self.joining))
        if change:
            self._apply(change)
        self.capacity.report(self.running, len(self.joining))

    def _apply(self, change) -> None:
        for _ in range(change.start if time.monotonic() >= self._start_after else 0):
            self._start()
        for ref in list(self.joining)[::-1][:change.cancel]:
            transport.kill(self.joining.pop(ref).actor)
            log.info("a lent rollout engine still starting was given up: capacity shrank")
        staying = [r for r in self.lent if r not in self.leaving]
        for rank in staying[::-1][:change.reclaim]:
            self._reclaim(rank, change.notice_s)

    def _start(self) -> None:
        actor = self.start_engine()
        version, weights = self.driver.held
        joining = _Joining(actor, None, version, time.monotonic() + self.join_timeout_s)
        self._load(joining, version, weights)

    def _load(self, joining: _Joining, version: WeightVersion, weights) -> None:
        group = self.driver.engines
        if weights is None:  # nothing published yet: it holds the initial weights, as the pool does
            joining.ref = group.submit_detached(joining.actor, RolloutWorker.weight_version)
        else:
            joining.ref = group.submit_detached(joining.actor, EngineHost.update_weights,
                                                self.driver.store_weights(weights), version, self.driver.partial)
        joining.version = version
        self.joining[joining.ref] = joining

    def _give_up(self, ref, why: str) -> None:
        joining = self.joining.pop(ref)
        transport.kill(joining.actor)
        self.join_failures += 1
        self._failed_in_a_row += 1
        wait = min(_BACKOFF_S, 2.0 ** (self._failed_in_a_row - 1))
        self._start_after = time.monotonic() + wait
        log.warning("a lent rollout engine failed to join the pool (%s): given up, the pool asks for another in "
                    "%.0f s", why, wait)

    def _owes(self, rank: int) -> bool:
        return any(rank in s.busy_engines() for s in self.driver.schedulers.values())

    def _reclaim(self, rank: int, notice_s: float | None) -> None:
        """Take lent engine ``rank`` back: drain it for ``notice_s`` (None: kill it now)."""
        if notice_s is None:
            log.info("lent rollout engine %d reclaimed without notice", rank)
            self._gone(rank, handed_back=[])
            return
        self.leaving[rank] = _Leaving(time.monotonic() + notice_s)
        self.driver.draining(rank)
        log.info("lent rollout engine %d reclaimed with %.0f s notice: it takes no new work", rank, notice_s)
        if notice_s == 0 or not self._owes(rank):
            self._stop(rank)

    def _stop(self, rank: int) -> None:
        """Stop its loop: its stream hands back what is unfinished, then ends (``ended``). An engine that owes
        nothing, or whose stream is not open, leaves at once."""
        leaving = self.leaving[rank]
        leaving.stopped_at = time.monotonic()
        if not self._owes(rank) or not self.driver.serving(rank):
            self._gone(rank, handed_back=[])
            return
        self.driver.engines.submit_to(rank, EngineHost.stop_serving)

    def _gone(self, rank: int, handed_back: list[GenerationResult]) -> None:
        owed = {(rid, i) for s in self.driver.schedulers.values()
                for rid, (engine, samples) in s.requests.live.items() if engine == rank for i in samples}
        usable = [r for r in handed_back if (r.request_id, r.sample_index) in owed]
        kept = {(r.request_id, r.sample_index) for r in usable if r.response_ids or r.offset}
        self.tokens_handed_back += sum(len(r.response_ids) for r in usable)
        self.samples_orphaned += len(owed - kept)
        self.leaving.pop(rank, None)
        self.lent.remove(rank)
        self.leaves += 1
        self.engine_seconds()
        # what it handed back of samples no longer owed (stopped meanwhile) goes as any late result: waste
        self.driver.deliver([r for r in handed_back if (r.request_id, r.sample_index) not in owed])
        self.driver.lost(rank, usable)
        self.capacity.report(self.running, len(self.joining))
        log.info("lent rollout engine %d left the pool (%d samples handed back, %d engines)", rank, len(kept),
                 len(self.driver.engines.live))


def lent_engines(cfg, base: int, start: Callable[[], Any]) -> LentEngines:
    """The lent-engine pool of ``cfg`` (an RLVRConfig with rollout.elastic) over ``base`` base engines."""
    e = cfg.rollout.elastic
    capacity = Capacity(base, e.max_engines, [(c.step, c.engines) for c in e.schedule], e.notice_s)
    return LentEngines(capacity, start, e.join_timeout_s)


def start_controller(spec: str, capacity: Capacity) -> None:
    """Call the operator's ``module:function`` (or ``file.py:function``) with the run's ``capacity``."""
    from gyre.rewards.base import RewardSpecError, load_function

    try:
        controller = load_function(spec)
    except RewardSpecError as exc:
        raise ValueError(f"rollout.elastic.controller: {exc}".replace("reward function", "controller")) from None
    controller(capacity)
