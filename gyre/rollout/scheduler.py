"""The sans-IO rollout scheduler: every group's lifecycle as a pure state machine.

It does no IO and never waits: the driver (``gyre.rollout.driver``, or a simulator) feeds it events
(prompts admitted, results generated, rewards scored) and carries out the commands it returns
(``Generate`` on an engine, ``Score`` on the reward pool). Lifecycle of a group:

    admit -> generate (its n samples) -> score (each sample as soon as it is generated) -> commit

Committed groups go to the ``GroupBuffer``; a training step takes its batch from there within the
staleness window of the async ratio alpha (0: synchronous).

Request ids and seeds are ``{stream}-{step}-{i}`` and ``derive_seed(run_seed, stream, step, i)`` for the
i-th group admitted for step ``step``, so the same run seed gives the same samples however requests
are spread over engines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gyre.rollout.assignment import assign_requests
from gyre.rollout.buffer import GroupBuffer
from gyre.seeding import derive_seed
from gyre.types import (
    GenerationRequest,
    GenerationResult,
    Group,
    PromptRecord,
    SamplingParams,
    Trajectory,
    WeightVersion,
)


@dataclass(frozen=True)
class ScheduleSpec:
    """What the scheduler is asked to produce."""

    group_size: int
    """Samples per prompt (n)."""
    batch_groups: int
    """Groups per training step (prompts per step, N)."""
    sampling: SamplingParams
    run_seed: int = 0
    stream: str = "train"
    """Names the request ids and seeds of this scheduler's groups ("train", "val")."""
    async_ratio: float = 0.0
    """alpha: how many versions a trained group may lag (``gyre.rollout.buffer``); 0 is synchronous."""


@dataclass(frozen=True)
class Generate:
    """Command: generate ``requests`` on engine ``engine`` (all samples of each request there)."""

    engine: int
    requests: tuple[GenerationRequest, ...]


@dataclass(frozen=True)
class Score:
    """Command: score these generated trajectories."""

    trajectories: tuple[Trajectory, ...]


@dataclass
class RolloutScheduler:
    spec: ScheduleSpec
    engines: int
    """How many rollout engines requests are spread over."""
    version: WeightVersion = 0
    """The policy version the engines hold now (start version of groups admitted now)."""
    buffer: GroupBuffer = field(default_factory=GroupBuffer)
    in_flight: dict[str, Group] = field(default_factory=dict)
    """Admitted groups not yet committed, by group id."""
    _seq: dict[str, int] = field(default_factory=dict)
    _admitted: int = 0
    _admitted_for: dict[int, int] = field(default_factory=dict)
    """Groups admitted so far for each step (numbers their request ids)."""

    # ---- admission ------------------------------------------------------------------------------
    def capacity(self, step: int) -> int:
        """How many more groups may be admitted for step ``step``: alpha = 0 admits exactly one batch per
        step; alpha > 0 keeps up to N * (1 + alpha) admitted and not yet trained on (ROLL Flash rule 3)."""
        unconsumed = len(self.in_flight) + len(self.buffer)
        budget = self.spec.batch_groups + round(self.spec.async_ratio * self.spec.batch_groups)
        return max(0, budget - unconsumed)

    def admit(self, step: int, prompts: Sequence[PromptRecord]) -> list[Generate]:
        """Admit one group per prompt under the current version; returns where to generate them."""
        stream, start = self.spec.stream, self._admitted_for.get(step, 0)
        requests = []
        for k, prompt in enumerate(prompts):
            i = start + k
            group_id = f"{stream}-{step}-{i}"
            seed = derive_seed(self.spec.run_seed, stream, step, i)
            group = Group(group_id, prompt, self.spec.group_size, seed, self.version)
            self.in_flight[group_id] = group
            self._seq[group_id] = self._admitted
            self._admitted += 1
            requests.append(GenerationRequest(group_id, prompt.prompt_ids, self.spec.sampling,
                                              n=self.spec.group_size, seed=seed))
        self._admitted_for[step] = start + len(prompts)
        plan = assign_requests(requests, self.engines)
        return [Generate(engine, tuple(requests[i] for i in idx)) for engine, idx in enumerate(plan) if idx]

    # ---- events ----------------------------------------------------------------------------------
    def on_generated(self, results: Sequence[GenerationResult]) -> list[Score]:
        """Finished samples arrived from an engine: each becomes a trajectory of its group, to be scored."""
        fresh = []
        for r in results:
            group = self.in_flight.get(r.request_id)
            if group is None:  # the group was aborted meanwhile: its late samples are dropped
                continue
            t = Trajectory.from_result(group.prompt, r)
            group.trajectories.append(t)
            fresh.append(t)
        return [Score(tuple(fresh))] if fresh else []

    def on_scored(self, trajectories: Sequence[Trajectory]) -> list[Group]:
        """Rewards arrived (set on the trajectories): commit every group now complete; returns them."""
        touched = {}
        for t in trajectories:
            if t.reward is None:
                raise ValueError(f"trajectory {t.prompt.uid}#{t.sample_index} reported scored without a reward")
            t.status = "scored"
        for gid, group in self.in_flight.items():
            if group.complete:
                touched[gid] = group
        for gid, group in touched.items():
            del self.in_flight[gid]
            # Samples in the order they were asked for, whatever order they finished in.
            group.trajectories.sort(key=lambda t: t.sample_index)
            self.buffer.put(self._seq.pop(gid), group)
        return list(touched.values())

    def on_published(self, version: WeightVersion) -> None:
        """The engines now hold ``version``: groups admitted from now on start there."""
        self.version = version

    # ---- batches ---------------------------------------------------------------------------------
    def ready(self, step: int) -> bool:
        """The buffer holds a full batch for step ``step`` within the staleness window."""
        return self.buffer.ready(step, self.spec.batch_groups, self.spec.async_ratio)

    def take(self, step: int) -> list[Group]:
        """Step ``step``'s batch: N committed groups, oldest admitted first."""
        return self.buffer.take(step, self.spec.batch_groups, self.spec.async_ratio)

    @property
    def idle(self) -> bool:
        """Nothing admitted is still generating or being scored."""
        return not self.in_flight
