"""Committed groups waiting to be trained on, and the staleness window that decides which may be.

ROLL Flash's async ratio alpha (``systems.md`` 2.2): the batch of training step n (which turns policy
version n - 1 into n) may hold a group only if its start version s satisfies (n - 1) - s <= ceil(alpha);
when alpha is fractional, groups exactly ceil(alpha) versions old fill at most floor(frac(alpha) * N) of
the batch. alpha = 0 takes only groups started under the current weights: synchronous training.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from gyre.types import Group, WeightVersion


def staleness_limit(alpha: float) -> int:
    """The most versions a trained group may lag behind the weights that train on it."""
    return math.ceil(alpha)


def oldest_quota(alpha: float, size: int) -> int:
    """How many of ``size`` groups may be exactly ``staleness_limit(alpha)`` versions old."""
    frac = alpha - math.floor(alpha)
    # Rounded first: 1.2 - 1 is 0.19999999999999996, and 0.2 x 5 must give 1, not 0.
    return size if round(frac, 12) == 0 else math.floor(round(frac * size, 9))


def staleness_stats(step: int, groups: list[Group], alpha: float) -> dict[str, float]:
    """How stale step ``step``'s batch is: the share of samples per version lag, the mean start lag, and
    window violations (groups older than alpha allows: must be 0)."""
    lags = [step - 1 - t.weight_version for g in groups for t in g.trajectories]
    limit = staleness_limit(alpha)
    out = {f"staleness/lag_{lag}": sum(x == lag for x in lags) / len(lags) for lag in range(limit + 1)}
    starts = [step - 1 - g.admitted_version for g in groups]
    out["staleness/mean"] = sum(starts) / len(starts)
    out["staleness/violations"] = sum(x > limit for x in starts)
    return out


@dataclass
class GroupBuffer:
    """Committed groups in admission order (``seq``), taken oldest first within the window."""

    entries: list[tuple[int, Group]] = field(default_factory=list)
    """(admission sequence number, group), sorted by sequence number."""
    expired: int = 0
    """Groups dropped because they fell out of the window before being trained on."""

    def put(self, seq: int, group: Group) -> None:
        group.status = "committed"
        bisect.insort(self.entries, (seq, group), key=lambda e: e[0])

    def __len__(self) -> int:
        return len(self.entries)

    def eligible(self, step: int, size: int, alpha: float) -> list[int]:
        """Indices into ``entries`` of the groups step ``step`` would take (at most ``size``)."""
        current, limit = step - 1, staleness_limit(alpha)
        quota = oldest_quota(alpha, size)
        chosen, oldest = [], 0
        for i, (_, g) in enumerate(self.entries):
            lag = current - g.admitted_version
            if lag > limit or lag < 0:
                continue
            if limit > 0 and lag == limit:
                if oldest >= quota:
                    continue
                oldest += 1
            chosen.append(i)
            if len(chosen) == size:
                break
        return chosen

    def ready(self, step: int, size: int, alpha: float) -> bool:
        return len(self.entries) >= size and len(self.eligible(step, size, alpha)) == size

    def take(self, step: int, size: int, alpha: float) -> list[Group]:
        """The ``size`` oldest eligible groups, in admission order; raises if there are fewer."""
        chosen = self.eligible(step, size, alpha)
        if len(chosen) < size:
            raise RuntimeError(f"step {step} needs {size} groups within the window, {len(chosen)} are committed")
        taken = set(chosen)
        groups = [g for i, (_, g) in enumerate(self.entries) if i in taken]
        self.entries = [e for i, e in enumerate(self.entries) if i not in taken]
        return groups

    def batch(self, step: int) -> list[tuple[int, Group]]:
        """The committed groups admitted for step ``step`` (lockstep), in admission order."""
        return [(seq, g) for seq, g in self.entries if g.admitted_for == step]

    def take_batch(self, step: int, size: int) -> list[Group]:
        """Lockstep: the first ``size`` groups admitted for step ``step``; raises if there are fewer."""
        mine = self.batch(step)[:size]
        if len(mine) < size:
            raise RuntimeError(f"step {step} needs {size} groups, {len(mine)} of its own are committed")
        taken = {id(g) for _, g in mine}
        self.entries = [(s, g) for s, g in self.entries if id(g) not in taken]
        return [g for _, g in mine]

    def drop_expired(self, step: int, alpha: float) -> list[Group]:
        """Remove groups too old for step ``step`` and any later step."""
        limit = staleness_limit(alpha)
        old = [g for _, g in self.entries if step - 1 - g.admitted_version > limit]
        self.entries = [(s, g) for s, g in self.entries if step - 1 - g.admitted_version <= limit]
        for g in old:
            g.status = "aborted"
        self.expired += len(old)
        return old


@dataclass(frozen=True)
class LockstepPlan:
    """Lockstep asynchrony: the version that generates each group is fixed in advance, not by timing.

    Step n's batch (which trains version n - 1 into n) is generated by version n - 1 - ceil(alpha) for
    its first ``oldest_quota`` groups and by n - 1 - floor(alpha) for the rest, clamped at 0: the oldest
    the window allows, so rollout runs as far ahead of training as alpha permits. An engine finishes
    every group of its version before it loads the next (no request spans an update), so what is
    sampled is a function of the run's seed alone, and a resumed run continues the same stream.
    """

    alpha: float
    size: int
    """Groups per batch (P)."""

    def parts(self, step: int) -> list[tuple[WeightVersion, int]]:
        """Step ``step``'s batch as (generating version, groups) parts, oldest first."""
        old = max(0, step - 1 - math.ceil(self.alpha))
        new = max(0, step - 1 - math.floor(self.alpha))
        quota = oldest_quota(self.alpha, self.size)
        if old == new or quota in (0, self.size):
            return [(old if quota == self.size else new, self.size)]
        return [(old, quota), (new, self.size - quota)]

    def due(self, version: WeightVersion, taken: int) -> list[tuple[int, int, int]]:
        """(step, part index, groups) of every part of the batches after step ``taken`` that ``version``
        (or an older one) generates, in step order."""
        out = []
        for step in range(taken + 1, version + 2 + math.ceil(self.alpha)):
            for k, (v, count) in enumerate(self.parts(step)):
                if v <= version:
                    out.append((step, k, count))
        return out
