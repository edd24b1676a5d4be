"""What the pipeline asks of the rollout: the next training batch, an evaluation, a weight publication.

``RolloutMachine`` owns the training scheduler, its prompt source and a port (``gyre.rollout.port``):
the real driver over Ray actors, or the simulated cluster, which drives the same machine. A training
step reads ``rollout.next_batch(step)``; after the update, ``rollout.publish(version, weights)`` hands
the new policy to every engine (suspend -> load -> resume at its next step boundary, no global barrier).
With alpha > 0 the engines keep generating for later steps meanwhile, and ``wait_for(until)`` lets the
learner's calls run while the rollout goes on.

Lockstep asynchrony (``ScheduleSpec.lockstep``) holds a publication until the engines have finished
every group of the version they hold (``LockstepPlan``), and admits the next version's groups only
once it is loaded; evaluation and checkpoints first let the engines settle, so the groups a checkpoint
keeps are complete.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gyre.rollout.ledger import step_line
from gyre.rollout.port import PhaseTimes, RolloutPort
from gyre.rollout.samples import SampleSource
from gyre.rollout.scheduler import RolloutScheduler, ScheduleSpec
from gyre.types import Group, PromptRecord, SamplingParams, Trajectory, WeightVersion


@dataclass
class Batch:
    """One training step's rollout: committed groups in admission order, where the time went, and the
    scheduler's counters since the previous batch."""

    groups: list[Group]
    times: PhaseTimes
    stats: dict[str, float] = field(default_factory=dict)
    ledger: dict[str, list] = field(default_factory=dict)
    """What became of prompts since the previous batch (``gyre.rollout.ledger``)."""

    @property
    def trajectories(self) -> list[Trajectory]:
        return [t for g in self.groups for t in g.trajectories]


class RolloutMachine:
    def __init__(self, driver: RolloutPort, spec: ScheduleSpec, prompts: Callable[[int], list[PromptRecord]],
                 activate: Callable[..., None] = lambda fresh=False: None, partial: bool = True,
                 sources: Callable[[SamplingParams], SampleSource] | None = None, live: bool = False):
        """``driver``: the port the machine drives (``RolloutDriver``, or the simulator's ``SimCluster``).
        ``prompts(k)`` draws the next k training prompts; ``activate()`` gives the engines the devices
        (time-shared roles; ``activate(fresh=True)`` before a whole new version loads); ``partial``: requests
        in flight at a weight update continue under the new weights (else they are regenerated). Multi-turn
        runs: ``sources(sampling)`` makes the episode runner of a scheduler (else each sample is one request).
        ``live``: the engines already hold version 0 (a simulated cluster's are built with it); else lockstep
        admits nothing before the first ``publish`` (the pipeline publishes version 0 before it asks for a
        batch)."""
        self.driver = driver
        self.spec = spec
        self.prompts = prompts
        self.activate = activate
        self.partial = partial
        self.sources = sources
        self.scheduler = RolloutScheduler(spec, driver.engine_count, source=sources(spec.sampling) if sources else None)
        self._pending: tuple[WeightVersion, Any] | None = None
        """Lockstep: a publication held until the engines settle."""
        self._live = live
        """The engines have been given weights (nothing is admitted before)."""

    @property
    def version(self) -> WeightVersion:
        """The policy's latest published version (lockstep engines may still hold an older one)."""
        return self._pending[0] if self._pending else self.scheduler.version

    def next_batch(self, step: int) -> Batch:
        """Admit what the window allows, run until step ``step``'s batch is committed, take it."""
        self.activate()
        sched = self.scheduler
        refill = self._refill(step)
        refill()
        times = self.driver.run(sched, lambda: sched.ready(step), "train", refill=refill)
        groups = sched.take(step)
        self.driver.send(sched.drain())  # what this step no longer needs is aborted
        return Batch(groups, times, sched.take_stats(), sched.take_ledger())

    def wait_for(self, until: Any) -> None:
        """Return once ``until`` is reached (the learner's calls are ready: a ``CallWait``; a virtual time in
        a simulation), carrying the rollout on meanwhile: samples scored and committed, new groups admitted
        as capacity frees (for the step after the next: the next one's are admitted already)."""
        self.driver.run(self.scheduler, lambda: False, "train", refill=self._refill(self.version + 2), until=until)

    def _refill(self, step: int) -> Callable[[], None]:
        """What admits after each event: lockstep's plan (and its held publication), else the regime's
        admission for step ``step``."""
        if self.spec.lockstep:
            return self._advance
        return lambda: self.scheduler.admit(step, self.prompts)

    def evaluate(self, prompts: Sequence[PromptRecord], params: SamplingParams, n: int) -> list[Group]:
        """Every prompt's n samples, scored (validation): a one-off scheduler on the same driver. A group
        given up (its environment failed more than ``env.max_failures`` times) is left out, not replaced:
        the prompts are fixed."""
        self.activate()
        self._flush()
        spec = ScheduleSpec(n, len(prompts), params, self.spec.run_seed, stream="val")
        scheduler = RolloutScheduler(spec, self.driver.engine_count, version=self.version,
                                     source=self.sources(params) if self.sources else None)
        scheduler.admit(0, lambda k: list(prompts[:k]))
        step = self.version + 1  # the step these weights would train: every group is on-policy for it
        try:
            self.driver.run(scheduler, lambda: scheduler.ready(step) or scheduler.idle, "val")
        finally:
            self.driver.release(scheduler)
        return scheduler.take(step) if scheduler.ready(step) else [g for _, g in scheduler.buffer.entries]

    def publish(self, version: WeightVersion, weights=None) -> None:
        """Every engine takes the policy's ``version`` at its next step boundary: loaded from ``weights``
        (what the learner exported), or for hybrid engines (the policy's own ranks) only the stamp moves.
        Verified on every engine; groups too stale to ever train are then aborted. Lockstep: once the
        engines have settled the version they hold (at once if they have). A second publication waits
        for the first to load, which costs nothing: the batch it waits for is the next step's."""
        if self.spec.lockstep:
            self._flush()  # the one held before is loaded first: no version is skipped
            self._pending = (version, weights)
            self._advance()
        else:
            self._load(version, weights)

    def _advance(self) -> None:
        """Lockstep: admit what the plan gives the engines' version (and refills); once that has settled,
        load the held publication and admit the new version's groups."""
        sched = self.scheduler
        if self._live:
            sched.admit(0, self.prompts)
        if self._pending is not None and sched.settled:
            self._load_pending()
            sched.admit(0, self.prompts)
        self.driver.send(sched.drain())

    def _flush(self) -> None:
        """Lockstep: let the engines settle their version, then load the held publication (admitting
        nothing new: the next ``next_batch`` or ``wait_for`` does)."""
        if not self.spec.lockstep:
            return
        self.settle()
        if self._pending is not None:
            self._load_pending()

    def _load_pending(self) -> None:
        (version, weights), self._pending = self._pending, None
        self._load(version, weights)

    def settle(self) -> None:
        """Lockstep: run until nothing is in flight and no batch waits for a refill at the current version."""
        sched = self.scheduler
        if self.spec.lockstep and self._live and not sched.settled:
            self.activate()
            self.driver.run(sched, lambda: sched.settled, "train", refill=lambda: sched.admit(0, self.prompts))

    def _load(self, version: WeightVersion, weights) -> None:
        """Give every engine ``version``; groups too stale to ever train are then aborted."""
        self.activate(fresh=weights is not None)  # a whole version arrives: an offloaded engine need not reload
        self.driver.load_weights(version, weights, self.partial)
        self._live = True
        self.scheduler.on_published(version)
        self.driver.send(self.scheduler.drain())

    def close(self) -> None:
        self.driver.close()

    def busy_seconds(self) -> list[float]:
        """Seconds each engine spent decoding since the last call."""
        return self.driver.busy_seconds()

    def state_dict(self) -> dict:
        self.settle()
        return self.scheduler.state_dict()

    def ledger_close(self, step: int) -> dict:
        """A ledger line closing the books at step ``step`` (a checkpoint, the run's end): what became of
        prompts since the last batch, and every prompt still pending."""
        return {**step_line(step, self.scheduler.take_ledger()), "pending": self.scheduler.pending_prompts()}

    def load_state_dict(self, state: dict, prompts: dict[str, PromptRecord], step: int = 0) -> None:
        """Continue from a checkpoint of step ``step``: its drawn-but-untrained prompts are admitted again
        first (lockstep: its committed groups are back in the buffer)."""
        self.scheduler.load_state_dict(state, prompts, step)
