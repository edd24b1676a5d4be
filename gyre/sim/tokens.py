"""Token sequences that cost nothing to hold: a simulated response of 30,000 tokens is one object.

The scheduler and the records it builds (``GenerationResult``, ``Trajectory``, ``Segment``) only take
lengths, slices and the first element of these sequences, so a simulated engine hands them ``Filler``
(n copies of one value) and ``VersionRuns`` (a run-length list of weight versions) instead of lists.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator, Sequence


class Filler(Sequence):
    """``n`` copies of ``value``; slices are ``Filler`` too."""

    __slots__ = ("n", "value")

    def __init__(self, n: int, value=0):
        self.n, self.value = max(0, int(n)), value

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index):
        if isinstance(index, slice):
            return Filler(len(range(*index.indices(self.n))), self.value)
        if not -self.n <= index < self.n:
            raise IndexError(index)
        return self.value

    def __iter__(self) -> Iterator:
        return itertools.repeat(self.value, self.n)

    def __eq__(self, other) -> bool:
        if isinstance(other, Filler):
            return self.n == other.n and (self.n == 0 or self.value == other.value)
        return isinstance(other, Sequence) and len(other) == self.n and all(x == self.value for x in other)

    def __hash__(self) -> int:
        return hash((self.n, self.value))

    def __repr__(self) -> str:
        return f"Filler({self.n}, {self.value!r})"


class VersionRuns(Sequence):
    """The weight version of each token as runs ``[(version, count), ...]``; indexing bisects the runs."""

    __slots__ = ("runs", "_ends")

    def __init__(self, runs: Sequence[tuple[int, int]]):
        self.runs = [(v, c) for v, c in runs if c > 0]
        self._ends = list(itertools.accumulate(c for _, c in self.runs))

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __getitem__(self, index):
        n = len(self)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if start == 0 and stop == n and step == 1:
                return self
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            out, begin = [], 0
            for (v, _), end in zip(self.runs, self._ends, strict=True):
                lo, hi = max(begin, start), min(end, stop)
                if lo < hi:
                    out.append((v, hi - lo))
                begin = end
            return VersionRuns(out)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(index)
        if index < self._ends[0]:  # most responses are one run
            return self.runs[0][0]
        return self.runs[bisect.bisect_right(self._ends, index)][0]

    def __iter__(self) -> Iterator[int]:
        return itertools.chain.from_iterable(itertools.repeat(v, c) for v, c in self.runs)

    def __repr__(self) -> str:
        return f"VersionRuns({self.runs})"
