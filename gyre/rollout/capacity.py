"""How many rollout engines a run should have now: the sans-IO half of elastic capacity.

``Capacity`` holds the pool's target size, between the base pool (``rollout.devices``, always there) and
``rollout.elastic.max_engines``. Three things move it: the config's schedule by training step
(``at_step``), and an operator's code calling ``lend(n)`` / ``reclaim(n)`` from any thread (serving
traffic fell or rose; a spot notice came). ``resize`` compares the target with what the pool holds and
says what to do (start engines, give up ones still starting, take back running ones, each reclaim with
its notice); the rollout driver carries it out (``gyre.rollout.elastic``) and reports back what happened,
so the same rule serves a real pool and a test.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

_UNSET = object()


@dataclass(frozen=True)
class Resize:
    """What the pool must do to reach its target."""

    start: int = 0
    """Lent engines to start."""
    cancel: int = 0
    """Engines still starting to give up (the newest first): cheaper than taking back a running one."""
    reclaim: int = 0
    """Running lent engines to take back (the newest first)."""
    notice_s: float | None = 0.0
    """Their notice (None: none, their samples are regenerated)."""

    def __bool__(self) -> bool:
        return bool(self.start or self.cancel or self.reclaim)


class Capacity:
    def __init__(self, base: int, most: int, schedule: Sequence[tuple[int, int]] = (), notice_s: float | None = 0.0):
        """``base`` engines always there, at most ``most``; ``schedule``: (step, engines) in step order;
        ``notice_s``: the notice of a reclaim that names none (the schedule's)."""
        if not 1 <= base <= most:
            raise ValueError(f"a pool of {base} base engines cannot grow to {most}")
        self.base, self.most = base, most
        self.schedule = tuple(schedule)
        self.notice_s = notice_s
        self._lock = threading.Lock()
        self._target = base
        self._notice: float | None = notice_s
        self._applied = -1
        """Index of the schedule entry last applied."""
        self._running, self._starting = base, 0

    @property
    def target(self) -> int:
        """Engines the pool should hold."""
        with self._lock:
            return self._target

    def lend(self, n: int = 1) -> int:
        """``n`` more engines are lent to the run (within max_engines); returns the new target."""
        return self._set(lambda t: t + n, f"lend({n})")

    def reclaim(self, n: int = 1, notice_s: float | None | object = _UNSET) -> int:
        """``n`` lent engines are taken back (never the base pool), each after ``notice_s`` (default: the
        config's; None: at once, its samples regenerated); returns the new target."""
        return self._set(lambda t: t - n, f"reclaim({n})", self.notice_s if notice_s is _UNSET else notice_s)

    def at_step(self, step: int) -> bool:
        """Training step ``step`` starts: the latest schedule entry at or before it applies, once (a resumed
        run lands on the size its step had). True when it raised the target."""
        due = [i for i, (at, _) in enumerate(self.schedule) if at <= step]
        if not due or due[-1] == self._applied:
            return False
        self._applied = due[-1]
        engines, raised = self.schedule[due[-1]][1], []

        def change(target: int) -> int:  # under the lock: an operator's lend meanwhile cannot skew the answer
            raised.append(engines > target)
            return engines

        self._set(change, f"schedule at step {self.schedule[due[-1]][0]}", self.notice_s)
        return raised[0]

    def lost(self, n: int = 1) -> int:
        """``n`` lent engines died: the target drops with them (they are not replaced until the schedule or an
        operator asks for more); returns the new target."""
        return self._set(lambda t: t - n, f"lost({n})")

    def report(self, running: int, starting: int) -> None:
        """The pool's state after a change (set by the driver): for an operator's code to read."""
        with self._lock:
            self._running, self._starting = running, starting

    @property
    def running(self) -> int:
        """Engines serving now and staying (the base pool and lent ones not being taken back)."""
        with self._lock:
            return self._running

    @property
    def starting(self) -> int:
        """Lent engines on their way (starting, loading the model, taking the weights)."""
        with self._lock:
            return self._starting

    def _set(self, change, what: str, notice_s: float | None | object = _UNSET) -> int:
        with self._lock:
            wanted = change(self._target)
            target = min(self.most, max(self.base, wanted))
            if target != wanted:
                log.warning("rollout capacity: %s asks for %d engines; the pool holds %d to %d (base pool to "
                            "rollout.elastic.max_engines), so it aims for %d", what, wanted, self.base, self.most,
                            target)
            self._target = target
            if notice_s is not _UNSET:
                self._notice = notice_s  # type: ignore[assignment]
            return target

    def resize(self, running: int, starting: int) -> Resize:
        """What to do when ``running`` engines serve (base and lent, not counting those already leaving) and
        ``starting`` lent ones are on their way: start the missing, or give up starting ones before taking
        running lent ones back."""
        with self._lock:
            target, notice = self._target, self._notice
        have = running + starting
        if target > have:
            return Resize(start=target - have)
        excess = have - target
        cancel = min(excess, starting)
        reclaim = min(excess - cancel, running - self.base)
        return Resize(cancel=cancel, reclaim=reclaim, notice_s=notice) if reclaim else Resize(cancel=cancel)
