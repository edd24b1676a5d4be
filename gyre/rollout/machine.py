"""What the pipeline asks of the rollout: the next training batch, an evaluation, a weight publication.

``RolloutMachine`` owns the training scheduler (its prompt source, its buffer) and the IO driver. A
training step reads ``groups = rollout.next_batch(step)``; after the update,
``rollout.publish(version, weights)`` hands the new policy to the engines.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gyre.cluster.group import RoleGroup
from gyre.rollout.driver import PhaseTimes, RolloutDriver
from gyre.rollout.scheduler import RolloutScheduler, ScheduleSpec
from gyre.types import Group, PromptRecord, SamplingParams, WeightVersion


@dataclass
class Batch:
    """One training step's rollout: committed groups in admission order, and where the time went."""

    groups: list[Group]
    times: PhaseTimes

    @property
    def trajectories(self):
        return [t for g in self.groups for t in g.trajectories]


class RolloutMachine:
    def __init__(self, engines: RoleGroup, rewards, spec: ScheduleSpec, prompts: Callable[[int], list[PromptRecord]],
                 activate: Callable[[], None], hybrid: bool, stream_parts: int = 8):
        """``prompts(k)`` draws the next k training prompts; ``activate()`` gives the engines the devices
        (time-shared roles); ``hybrid``: the engines are the policy's own ranks (weights shared in place)."""
        self.engines = engines
        self.spec = spec
        self.prompts = prompts
        self.activate = activate
        self.hybrid = hybrid
        self.driver = RolloutDriver(engines, rewards, stream_parts)
        self.scheduler = RolloutScheduler(spec, len(engines))

    @property
    def version(self) -> WeightVersion:
        return self.scheduler.version

    def next_batch(self, step: int) -> Batch:
        """Admit what the window allows, run until step ``step``'s batch is committed, take it."""
        self.activate()
        commands = self.scheduler.admit(step, self.prompts(self.scheduler.capacity(step)))
        times = self.driver.run(self.scheduler, commands, lambda: self.scheduler.ready(step), label="train")
        return Batch(self.scheduler.take(step), times)

    def evaluate(self, prompts: Sequence[PromptRecord], params: SamplingParams, n: int) -> list[Group]:
        """Every prompt's n samples, scored (validation): a one-off scheduler on the same driver."""
        self.activate()
        spec = ScheduleSpec(n, len(prompts), params, self.spec.run_seed, stream="val")
        scheduler = RolloutScheduler(spec, len(self.engines), version=self.version)
        commands = scheduler.admit(0, prompts)
        step = self.version + 1  # the step these weights would train: every group is on-policy for it
        self.driver.run(scheduler, commands, lambda: scheduler.ready(step), label="val")
        return scheduler.take(step)

    def publish(self, version: WeightVersion, weights=None) -> None:
        """The engines take the policy's ``version``: loaded from ``weights`` (a ``WeightBundle``), or, for
        hybrid engines that sample with the training weights, only the stamp moves. Verified on every engine."""
        if self.hybrid:
            versions = self.engines.call("set_weight_version", version)
        else:
            if weights is None:
                raise ValueError("separate rollout engines need the exported weights to publish a version")
            self.activate()
            versions = self.engines.call("load_weights", weights)
        if any(v != version for v in versions):
            raise RuntimeError(f"weight sync failed: rollout workers report versions {versions}, expected {version}")
        self.scheduler.on_published(version)
