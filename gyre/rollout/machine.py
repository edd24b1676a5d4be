"""What the pipeline asks of the rollout: the next training batch, an evaluation, a weight publication.

``RolloutMachine`` owns the training scheduler, its prompt source and the IO driver. A training step
reads ``rollout.next_batch(step)``; after the update, ``rollout.publish(version, weights)`` hands the
new policy to every engine (suspend -> load -> resume at its next step boundary, no global barrier).
With alpha > 0 the engines keep generating for later steps meanwhile, and ``wait_for(refs)`` lets
the learner's calls run while the rollout goes on.

Lockstep asynchrony (``ScheduleSpec.lockstep``) holds a publication until the engines have finished
every group of the version they hold (``LockstepPlan``), and admits the next version's groups only
once it is loaded; evaluation and checkpoints first let the engines settle, so the groups a checkpoint
keeps are complete.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gyre.cluster.faults import RoleFault
from gyre.cluster.group import RoleGroup
from gyre.cluster.workers import EngineHost, RolloutWorker
from gyre.rollout.driver import PhaseTimes, RolloutDriver
from gyre.rollout.episodes import EpisodeRunner
from gyre.rollout.scheduler import RolloutScheduler, ScheduleSpec
from gyre.types import Group, PromptRecord, SamplingParams, Trajectory, WeightVersion


@dataclass
class Batch:
    """One training step's rollout: committed groups in admission order, where the time went, and the
    scheduler's counters since the previous batch."""

    groups: list[Group]
    times: PhaseTimes
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def trajectories(self) -> list[Trajectory]:
        return [t for g in self.groups for t in g.trajectories]


class RolloutMachine:
    def __init__(self, engines: RoleGroup, rewards, spec: ScheduleSpec, prompts: Callable[[int], list[PromptRecord]],
                 activate: Callable[[], None], partial: bool = True, emit_every: int = 1, replaceable: bool = True,
                 episodes: Callable[[SamplingParams], EpisodeRunner] | None = None, envs=None):
        """``prompts(k)`` draws the next k training prompts; ``activate()`` gives the engines the devices
        (time-shared roles); ``partial``: requests in flight at a weight update continue under the new
        weights (else they are regenerated); ``replaceable``: a dead engine is replaced in place (not for
        hybrid engines, which are policy ranks). Multi-turn runs: ``episodes(sampling)`` makes the runner
        of a scheduler's episodes, ``envs`` is the environment pool (``gyre.cluster.env_pool``)."""
        self.engines = engines
        self.spec = spec
        self.prompts = prompts
        self.activate = activate
        self.partial = partial
        self.episodes = episodes
        self.driver = RolloutDriver(engines, rewards, emit_every,
                                    restore=self._restore if replaceable and engines.spawn else None, envs=envs)
        self.scheduler = RolloutScheduler(spec, len(engines), episodes=episodes(spec.sampling) if episodes else None)
        self._held: tuple[WeightVersion, object] = (0, None)
        """The version and weights the engines hold (or are being given): what a replacement engine gets."""
        self._pending: tuple[WeightVersion, object] | None = None
        """Lockstep: a publication held until the engines settle."""
        self._live = False
        """The engines have been given weights (nothing is admitted before)."""
        self._readmit: list[PromptRecord] = []

    @property
    def version(self) -> WeightVersion:
        """The policy's latest published version (lockstep engines may still hold an older one)."""
        return self._pending[0] if self._pending else self.scheduler.version

    def next_batch(self, step: int) -> Batch:
        """Admit what the window allows, run until step ``step``'s batch is committed, take it."""
        self.activate()
        sched = self.scheduler
        refill = self._advance if self.spec.lockstep else lambda: sched.admit(step, self._draw)
        refill()
        times = self.driver.run(sched, lambda: sched.ready(step), "train", refill=refill)
        groups = sched.take(step)
        self.driver.send(sched.drain())  # what this step no longer needs is aborted
        return Batch(groups, times, sched.take_stats())

    def wait_for(self, group: RoleGroup, method: str, refs: Sequence) -> None:
        """Return once ``refs`` (a call of ``method`` on ``group``, within its deadline) are ready, carrying
        the rollout on meanwhile: samples scored and committed, new groups admitted as capacity frees."""
        sched, step = self.scheduler, self.version + 2  # admitted now, they serve the step after this one
        refill = self._advance if self.spec.lockstep else lambda: sched.admit(step, self._draw)
        if refs:
            self.driver.run(sched, lambda: False, "train", refill=refill, until=refs, until_call=(group, method))

    def evaluate(self, prompts: Sequence[PromptRecord], params: SamplingParams, n: int) -> list[Group]:
        """Every prompt's n samples, scored (validation): a one-off scheduler on the same driver. A group
        given up (its environment failed more than ``env.max_failures`` times) is left out, not replaced:
        the prompts are fixed."""
        self.activate()
        self._flush()
        spec = ScheduleSpec(n, len(prompts), params, self.spec.run_seed, stream="val")
        scheduler = RolloutScheduler(spec, len(self.engines), version=self.version,
                                     episodes=self.episodes(params) if self.episodes else None)
        scheduler.admit(0, lambda k: list(prompts[:k]))
        step = self.version + 1  # the step these weights would train: every group is on-policy for it
        try:
            self.driver.run(scheduler, lambda: scheduler.ready(step) or scheduler.idle, "val")
        finally:
            self.driver.schedulers.pop("val", None)
        return scheduler.take(step) if scheduler.ready(step) else [g for _, g in scheduler.buffer.entries]

    def publish(self, version: WeightVersion, weights=None) -> None:
        """Every engine takes the policy's ``version`` at its next step boundary: loaded from ``weights``
        (a ``WeightBundle`` ref list), or for hybrid engines (the policy's own ranks) only the stamp moves.
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
            sched.admit(0, self._draw)
        if self._pending is not None and sched.settled:
            self._load_pending()
            sched.admit(0, self._draw)
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
            self.driver.run(sched, lambda: sched.settled, "train", refill=lambda: sched.admit(0, self._draw))

    def _load(self, version: WeightVersion, weights) -> None:
        """Give every engine ``version``; an engine that dies or hangs meanwhile is replaced by a fresh one
        holding it (when engines are replaceable), then every engine is asked once more."""
        self.activate()
        try:
            versions = self.engines.call(EngineHost.update_weights, weights, version, self.partial)
        except RoleFault as fault:
            if fault.kind == "error" or self.driver.restore is None:
                raise
            self._held = (version, weights)
            for rank in fault.ranks:
                self.driver.replace(rank, fault)
            versions = self.engines.call(EngineHost.update_weights, weights, version, self.partial)
        if any(v != version for v in versions):
            raise RuntimeError(f"weight sync failed: rollout workers report versions {versions}, expected {version}")
        self._held, self._live = (version, weights), True
        self.scheduler.on_published(version)
        self.driver.send(self.scheduler.drain())

    def close(self) -> None:
        self.driver.close()

    def busy_seconds(self) -> list[float]:
        """Seconds each engine spent decoding since the last call."""
        group = self.engines
        refs = [group.submit_to(rank, EngineHost.busy_seconds, probe=True) for rank in range(len(group))]
        return group.gather(refs, EngineHost.busy_seconds)

    def state_dict(self) -> dict:
        self.settle()
        state = self.scheduler.state_dict()
        # Prompts a checkpoint gave back and not admitted again yet come first.
        state["admitted"] = [p.uid for p in self._readmit] + state["admitted"]
        return state

    def load_state_dict(self, state: dict, prompts: dict[str, PromptRecord], step: int = 0) -> None:
        """Continue from a checkpoint of step ``step``: its drawn-but-untrained prompts are admitted again
        first (lockstep: its committed groups are back in the buffer)."""
        self._readmit = self.scheduler.load_state_dict(state, prompts, step)

    def _draw(self, k: int) -> list[PromptRecord]:
        """The next k prompts: those a checkpoint left admitted, then the prompt source's."""
        out, self._readmit = self._readmit[:k], self._readmit[k:]
        return out + (self.prompts(k - len(out)) if k > len(out) else [])

    def _restore(self, rank: int) -> None:
        """A fresh engine for ``rank``, loaded (it may start offloaded) and given the current weights."""
        group, (version, weights) = self.engines, self._held
        group.respawn(rank)
        group.gather([group.submit_to(rank, RolloutWorker.reload)], RolloutWorker.reload, ranks=[rank])
        held = group.gather([group.submit_to(rank, EngineHost.update_weights, weights, version, self.partial)],
                            EngineHost.update_weights, ranks=[rank])
        if held != [version]:
            raise RuntimeError(f"a replacement {group.name} engine reports version {held}, expected {version}")
