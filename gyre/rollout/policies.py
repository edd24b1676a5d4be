"""The scheduler's optional policies, each a rule from the ROLL family (``systems.md``):

- ``GroupFilter``: DAPO's dynamic sampling (1.9): a committed group whose rewards have no variance, or
  whose mean lies outside a range, is dropped and its slot refilled by a newly admitted prompt.
- ``TailBatching``: RollPacker's rounds (3.1): a short round launches ceil(eta_p * P) prompts with
  ceil(eta_r * R) samples each and keeps the first R samples of the first P prompts to complete; the
  prompts it cuts wait in a long-prompt queue until it holds P, and the next round runs exactly those
  to completion, without speculation. No prompt is dropped or trained twice.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from gyre.types import Group, PromptRecord


@dataclass(frozen=True)
class GroupFilter:
    """Which committed groups train. ``min_std``: drop groups whose reward std is at or below it (DAPO:
    all-correct or all-wrong groups teach nothing under group normalisation); ``mean_range``: keep
    groups whose mean reward lies strictly inside (low, high)."""

    min_std: float | None = 0.0
    mean_range: tuple[float, float] | None = None

    def keeps(self, group: Group) -> bool:
        scores = [t.reward.score for t in group.trajectories]
        mean = sum(scores) / len(scores)
        if self.min_std is not None:
            std = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores))
            if std <= self.min_std:
                return False
        if self.mean_range is not None:
            low, high = self.mean_range
            if not low < mean < high:
                return False
        return True


@dataclass(frozen=True)
class TailSpec:
    eta_prompts: float = 1.25
    """Prompts a short round launches, as a multiple of the batch's P (RollPacker's recommended 1.25)."""
    eta_samples: float = 1.25
    """Samples each prompt of a short round asks for, as a multiple of the group size R."""


@dataclass
class TailBatching:
    spec: TailSpec
    long_queue: deque[PromptRecord] = field(default_factory=deque)
    """Prompts cut from short rounds, in the order they were cut."""
    rounds: dict[str, int] = field(default_factory=lambda: {"short": 0, "long": 0})

    def plan(self, batch: int, group_size: int) -> tuple[str, int, int]:
        """The next round: (kind, prompts to launch, samples per prompt)."""
        if len(self.long_queue) >= batch:
            return "long", batch, group_size
        return "short", math.ceil(self.spec.eta_prompts * batch), math.ceil(self.spec.eta_samples * group_size)

    def take_long(self, batch: int) -> list[PromptRecord]:
        return [self.long_queue.popleft() for _ in range(batch)]

    def cut(self, prompts: list[PromptRecord]) -> None:
        self.long_queue.extend(prompts)
