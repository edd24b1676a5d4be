"""Phase spans recorded by the workers themselves: when each actor computed what.

A worker's recorder lives on the worker instance (``recorder_of``), not in a module global, because
in-process actors (``gyre.cluster.local``) share the driver's process. Methods that are phases are
wrapped with ``@timed("train")``; a rollout engine's loop records its decoding steps as busy
intervals (consecutive steps merge into one span). The driver takes them with ``take_spans`` on the
actor's probe thread (``actor.__ray_call__``), once per step, and writes ``timeline.jsonl``
(``gyre.tracking.timeline``). Times are wall-clock seconds (``time.time()``), comparable across
processes on one machine (and across nodes as far as their clocks agree).
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections import deque
from contextlib import contextmanager

MAX_SPANS = 4096
"""Spans a worker holds between two drains; the oldest go first (and are counted) past it."""
MERGE_GAP_S = 0.02
"""Spans of one phase closer than this merge: an engine's decoding steps, environment steps of many slots."""
_MERGE_LOOKBACK = 8
"""Spans looked back through for one of the same phase to merge with (keeps ``add`` O(1))."""
_ATTR = "_gyre_spans"


class SpanRecorder:
    """A bounded, thread-safe buffer of (phase, start, end) for one worker."""

    def __init__(self, limit: int = MAX_SPANS):
        self._spans: deque[list] = deque(maxlen=limit)
        self._lock = threading.Lock()
        self.dropped = 0
        """Spans pushed out of the full buffer since the last ``take``."""

    def add(self, phase: str, start: float, end: float, merge_gap_s: float = MERGE_GAP_S) -> None:
        """Record one span; it extends the latest span of the same phase when it overlaps it or starts within
        ``merge_gap_s`` of its end (concurrent calls on several threads merge into one busy interval)."""
        with self._lock:
            for last in itertools.islice(reversed(self._spans), _MERGE_LOOKBACK):
                if last[0] != phase:
                    continue
                if start <= last[2] + merge_gap_s and end >= last[1] - merge_gap_s:
                    last[1], last[2] = min(last[1], start), max(last[2], end)
                    return
                break
            if len(self._spans) == self._spans.maxlen:
                self.dropped += 1
            self._spans.append([phase, start, end])

    @contextmanager
    def span(self, phase: str):
        start = time.time()
        try:
            yield
        finally:
            self.add(phase, start, time.time())

    def take(self) -> tuple[list[tuple[str, float, float]], int]:
        """The spans recorded since the last call, oldest first, and how many were dropped meanwhile."""
        with self._lock:
            spans, dropped = [tuple(s) for s in self._spans], self.dropped
            self._spans.clear()
            self.dropped = 0
        return spans, dropped


def recorder_of(instance) -> SpanRecorder:
    """The recorder of one worker instance, made on first use (``setdefault`` is atomic, so two threads
    of one actor get the same one)."""
    found = instance.__dict__.get(_ATTR)
    return found if found is not None else instance.__dict__.setdefault(_ATTR, SpanRecorder())


def timed(name: str):
    """Decorate a worker method: each call is recorded as a span of phase ``name``."""
    def wrap(method):
        @functools.wraps(method)
        def recorded(self, *args, **kwargs):
            with recorder_of(self).span(name):
                return method(self, *args, **kwargs)
        return recorded
    return wrap


def take_spans(instance) -> tuple[list[tuple[str, float, float]], int]:
    """Run inside an actor (``actor.__ray_call__``): its spans since the last take, and the count dropped."""
    found = instance.__dict__.get(_ATTR)
    return found.take() if found is not None else ([], 0)
