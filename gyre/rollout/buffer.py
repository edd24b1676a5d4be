"""Committed groups waiting to be trained on, and the staleness window that decides which may be.

ROLL Flash's async ratio alpha (``systems.md`` 2.2): the batch of training step n (which turns policy
version n - 1 into n) may hold a group only if its start version s satisfies (n - 1) - s <= ceil(alpha);
when alpha is fractional, groups exactly ceil(alpha) versions old fill at most floor(frac(alpha) * N) of
the batch. alpha = 0 takes only groups started under the current weights: synchronous training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gyre.types import Group


def staleness_limit(alpha: float) -> int:
    """The most versions a trained group may lag behind the weights that train on it."""
    return math.ceil(alpha)


def oldest_quota(alpha: float, size: int) -> int:
    """How many of ``size`` groups may be exactly ``staleness_limit(alpha)`` versions old."""
    frac = alpha - math.floor(alpha)
    # Rounded first: 1.2 - 1 is 0.19999999999999996, and 0.2 x 5 must give 1, not 0.
    return size if round(frac, 12) == 0 else math.floor(round(frac * size, 9))


@dataclass
class GroupBuffer:
    """Committed groups in admission order (``seq``), taken oldest first within the window."""

    entries: list[tuple[int, Group]] = field(default_factory=list)
    """(admission sequence number, group), sorted by sequence number."""
    expired: int = 0
    """Groups dropped because they fell out of the window before being trained on."""

    def put(self, seq: int, group: Group) -> None:
        group.status = "committed"
        self.entries.append((seq, group))
        self.entries.sort(key=lambda e: e[0])

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
        return len(self.eligible(step, size, alpha)) == size

    def take(self, step: int, size: int, alpha: float) -> list[Group]:
        """The ``size`` oldest eligible groups, in admission order; raises if there are fewer."""
        chosen = self.eligible(step, size, alpha)
        if len(chosen) < size:
            raise RuntimeError(f"step {step} needs {size} groups within the window, {len(chosen)} are committed")
        taken = set(chosen)
        groups = [g for i, (_, g) in enumerate(self.entries) if i in taken]
        self.entries = [e for i, e in enumerate(self.entries) if i not in taken]
        return groups

    def drop_expired(self, step: int, alpha: float) -> list[Group]:
        """Remove groups too old for step ``step`` and any later step."""
        limit = staleness_limit(alpha)
        old = [g for _, g in self.entries if step - 1 - g.admitted_version > limit]
        self.entries = [(s, g) for s, g in self.entries if step - 1 - g.admitted_version <= limit]
        for g in old:
            g.status = "aborted"
        self.expired += len(old)
        return old
