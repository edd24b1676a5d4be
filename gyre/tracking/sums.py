"""Sums and counts of metrics, merged across micro-batches, optimizer steps and ranks."""

from __future__ import annotations


class MetricSums:
    """Token- (or sample-) weighted metric sums; ``means`` divides once everything is merged, so a
    metric averages over all tokens of a step, not over ranks or micro-batches of unequal size."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, float] = {}

    def add(self, name: str, total: float, count: float = 1.0) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + float(total)
        self.counts[name] = self.counts.get(name, 0.0) + float(count)

    def merge(self, other: MetricSums) -> MetricSums:
        for name, total in other.sums.items():
            self.add(name, total, other.counts[name])
        return self

    def means(self) -> dict[str, float]:
        return {k: self.sums[k] / self.counts[k] for k in self.sums if self.counts[k] > 0}
