"""Faults of role workers: a deadline on every remote call, hang diagnosis, and typed errors that name the
role, the ranks, what they were doing and why.

``gather`` is the one place the driver waits on a role's calls. It returns results in rank order, or
raises ``RoleFault``:

- ``died``: a worker's process is gone (killed, out of memory, its node lost), or a rank lost a peer
  inside a collective (gloo/NCCL report the connection, not the death). Recoverable: the run rebuilds
  its roles and continues from its last checkpoint.
- ``hung``: the call passed its deadline. Before raising, every unfinished rank is probed on a thread of
  its own (a Ray concurrency group, so the probe does not queue behind the stuck call): a rank that
  answers reports where its busy thread is (e.g. inside ``all_reduce``); one that does not answer is
  stopped or frozen in native code. Recoverable, like a death.
- ``error``: the method raised. Not recoverable (it would raise again): the run stops with the cause.

``Watchdog`` derives each call's deadline from the config (``watchdog`` section): a hard ceiling for
any call, and a stall bound of ``stall_factor`` x the call's usual duration once it has a history;
it also reports a heartbeat when a call runs far longer than usual, for the progress line.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from gyre.cluster import transport
from gyre.cluster.transport import ActorLost, CallRaised

FaultKind = Literal["died", "hung", "error"]
PROBE = "probe"
"""The Ray concurrency group every role actor has for liveness probes: a thread of its own, so a probe
answers while the actor's methods run (``actor.method.options(concurrency_group=PROBE)``)."""
_SLICE_S = 0.5
"""Longest single wait: signals (Ctrl-C, SIGTERM) and heartbeats are handled at least this often."""
_PROBE_S = 2.0
_PEER_GRACE_S = 3.0
"""After a rank raised, how long to look for a dead peer (a collective fails on the survivors too)."""
_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "ncclRemoteError")
"""How gloo and NCCL word a peer's disappearance, in the exception's own message."""
_LOST_PEER = "lost a peer rank inside a collective: "


@dataclass
class RoleFault(Exception):
    """A role's call failed: its worker died, hung, or raised."""

    role: str
    ranks: tuple[int, ...]
    method: str
    kind: FaultKind
    cause: str

    @property
    def recoverable(self) -> bool:
        return self.kind != "error"

    def __str__(self) -> str:
        who = f"{self.role} rank{'s' if len(self.ranks) > 1 else ''} {', '.join(map(str, self.ranks))}"
        verb = {"died": "died", "hung": "hung", "error": "failed"}[self.kind]
        return f"{who} {verb} during {self.method}: {self.cause.rstrip('. ')}"


class RunFailed(RuntimeError):
    """A role fault the run could not recover from (recovery off or exhausted, or the method raised)."""

    def __init__(self, fault: RoleFault, recoveries: int, max_restarts: int, output_dir):
        self.fault, self.recoveries, self.max_restarts, self.output_dir = fault, recoveries, max_restarts, output_dir
        if not fault.recoverable:
            why = "it raised, which would happen again on a restart"
        elif max_restarts == 0:
            why = "in-run recovery is off (run.max_restarts: 0)"
        else:
            why = f"in-run recovery is exhausted ({recoveries} of run.max_restarts={max_restarts} used)"
        super().__init__(f"{fault}. The run stopped: {why}.")


@dataclass
class Watchdog:
    """Per-call deadlines and heartbeats (see the module docstring)."""

    call_timeout_s: float = 3600.0
    stall_factor: float = 20.0
    stall_min_s: float = 300.0
    heartbeat_factor: float = 3.0
    on_slow: Callable[[str, float, float | None], None] | None = None
    """Called while a call runs past heartbeat_factor x its usual duration: (what, elapsed, usual)."""
    history: dict[str, deque] = field(default_factory=dict)
    warm: set[str] = field(default_factory=set)
    """Calls made since the workers were (re)built: the first of each loads or compiles what it needs."""

    @classmethod
    def from_config(cls, cfg) -> Watchdog:
        return cls(cfg.call_timeout_s, cfg.stall_factor, cfg.stall_min_s, cfg.heartbeat_factor)

    def usual(self, key: str) -> float | None:
        """The median of the call's recent durations, once it has run three times."""
        seen = self.history.get(key)
        return statistics.median(seen) if seen and len(seen) >= 3 else None

    def rebuilt(self) -> None:
        """New workers: each call's first run gets the ceiling again (its history stays)."""
        self.warm.clear()

    def deadline_s(self, key: str) -> float:
        usual = self.usual(key)
        if usual is None or key not in self.warm:
            return self.call_timeout_s  # first calls load models, compile, warm caches: only the ceiling
        return min(self.call_timeout_s, max(self.stall_min_s, self.stall_factor * usual))

    def observe(self, key: str, seconds: float) -> None:
        self.history.setdefault(key, deque(maxlen=20)).append(seconds)
        self.warm.add(key)

    def tick(self, key: str, elapsed: float) -> None:
        usual = self.usual(key)
        if usual is None:
            slow = elapsed > 60.0
        else:
            slow = elapsed > self.heartbeat_factor * usual and elapsed > 5.0
        if slow and self.on_slow is not None:
            self.on_slow(key, elapsed, usual)


def _classify_error(exc: BaseException) -> tuple[FaultKind, str]:
    exc = transport.translate(exc)  # e.g. the rollout coordinator's own ray.get
    if isinstance(exc, ActorLost):
        first = _first_line(str(exc)) or exc.origin
        raised = _raised(str(exc))
        if "creation task" in first and raised and raised not in first:  # the constructor's own exception
            first = f"{first} ... {raised}"
        return "died", first
    if isinstance(exc, CallRaised) and exc.lost:
        return "died", exc.lost  # it raised because something it needed died (e.g. the weights' owner)
    text = str(exc)
    if any(marker in _last_lines(text) for marker in _PEER_LOST):  # the raised message, not the traceback
        return "died", _LOST_PEER + _last_lines(text)
    return "error", _last_lines(text)


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0][:300] if lines else ""


def _raised(text: str) -> str:
    """The last line of a traceback that is not one of Python's caret markers: the exception raised."""
    lines = [line.strip() for line in text.splitlines() if line.strip().strip("^~ ")]
    return lines[-1][:300] if len(lines) > 1 else ""


def _last_lines(text: str) -> str:
    """The raised exception itself (the end of a remote traceback), not Ray's framing."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " ".join(lines[-2:])[:500] if lines else "unknown error"


_IDLE_FRAMES = ("/ray/", "threading.py", "/concurrent/futures/", "/queue.py", "/selectors.py", "/cluster/local.py")


def probe_report(_instance=None) -> str:
    """Run inside a worker on the probe thread: where the worker's busy threads are (the innermost
    frames of every thread other than this one that is running more than Ray's and the pools' own code)."""
    here = threading.get_ident()
    frames = sys._current_frames()
    peer = getattr(threading.current_thread(), "peer_lane", None)
    if peer is not None:  # an in-process actor (gyre.cluster.local): its own thread, not the driver's
        frames = {peer.ident: frames[peer.ident]} if peer.ident in frames else {}
    parts = []
    for ident, frame in frames.items():
        if ident == here:
            continue
        stack = []
        while frame is not None:
            code = frame.f_code
            stack.append((code.co_filename, frame.f_lineno, code.co_name))
            frame = frame.f_back
        if all(any(mark in f for mark in _IDLE_FRAMES) for f, _, _ in stack):
            continue  # Ray's threads and idle pools
        inner = [f"{name} ({os.path.basename(f)}:{line})" for f, line, name in stack[:3]]
        parts.append(" <- ".join(inner))
    return f"pid {os.getpid()} busy in " + "; ".join(parts) if parts else f"pid {os.getpid()} idle"


def _probe(actors: Sequence, ranks: list[int]) -> dict[int, str]:
    refs = {rank: actors[rank].__ray_call__.options(concurrency_group=PROBE).remote(probe_report) for rank in ranks}
    ready, _ = transport.wait(list(refs.values()), num_returns=len(refs), timeout=_PROBE_S)
    out = {}
    for rank, ref in refs.items():
        if ref in ready:
            try:
                out[rank] = transport.get(ref)
            except Exception as exc:  # noqa: BLE001 - a probe that failed is itself the answer
                out[rank] = f"probe failed: {_first_line(str(exc))}"
        else:
            out[rank] = "does not respond (stopped, or frozen in native code)"
    return out


class CallClock:
    """The deadline of one call (or one wait on several workers' calls), with heartbeats."""

    def __init__(self, watchdog: Watchdog | None, role: str, method: str):
        self.watchdog, self.role, self.method = watchdog, role, method
        self.key = f"{role}.{method}"
        self.deadline_s = watchdog.deadline_s(self.key) if watchdog is not None else float("inf")
        self.start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def expired(self) -> bool:
        return self.elapsed() > self.deadline_s

    def slice(self) -> float:
        """How long the next single wait may block."""
        return max(0.0, min(_SLICE_S, self.deadline_s - self.elapsed()))

    def tick(self) -> None:
        if self.watchdog is not None:
            self.watchdog.tick(self.key, self.elapsed())

    def done(self) -> None:
        if self.watchdog is not None:
            self.watchdog.observe(self.key, self.elapsed())

    def hung(self, actors: Sequence, stuck: list[int]) -> RoleFault:
        """The fault for ranks ``stuck``, after probing each of them."""
        report = _probe(actors, stuck)
        cause = f"no result after {self.elapsed():.0f} s (deadline {self.deadline_s:.0f} s); " + "; ".join(
            f"rank {r}: {why}" for r, why in report.items())
        return RoleFault(self.role, tuple(stuck), self.method, "hung", cause)


def gather(refs: Sequence, role: str, method: str, actors: Sequence, watchdog: Watchdog | None,
           ranks: Sequence[int] | None = None) -> list:
    """Results of ``refs`` (one per rank, in order), or a ``RoleFault`` (see the module docstring)."""
    ranks = list(ranks if ranks is not None else range(len(refs)))
    clock = CallClock(watchdog, role, method)
    pending = dict(zip(refs, ranks))
    results: dict[int, object] = {}
    while pending:
        if clock.expired():
            raise clock.hung(actors, sorted(pending.values()))
        ready, _ = transport.wait(list(pending), num_returns=1, timeout=clock.slice())
        clock.tick()
        for ref in ready:
            rank = pending.pop(ref)
            try:
                results[rank] = transport.get(ref)
            except Exception as exc:  # noqa: BLE001 - classified into a RoleFault below
                raise fault_from(exc, role, rank, method, pending) from None
    clock.done()
    return [results[r] for r in ranks]


def fault_from(exc: BaseException, role: str, rank: int, method: str, pending: dict | None = None) -> RoleFault:
    """The fault to report for ``rank``'s failure; a raise that follows the death of a peer in
    ``pending`` (ref -> rank) is reported as that death."""
    kind, cause = _classify_error(exc)
    # A survivor of a collective raises too (its error, or the lost connection that gloo/NCCL report):
    # the fault to recover from is the peer's death, when one shows within the grace period.
    if (kind == "error" or cause.startswith(_LOST_PEER)) and pending:
        ready, _ = transport.wait(list(pending), num_returns=len(pending), timeout=_PEER_GRACE_S)
        for ref in ready:
            try:
                transport.get(ref)
            except Exception as peer_exc:  # noqa: BLE001 - looking for a death among the peers
                peer_kind, peer_cause = _classify_error(peer_exc)
                if peer_kind == "died" and not peer_cause.startswith(_LOST_PEER):
                    return RoleFault(role, (pending[ref],), method, "died", peer_cause)
    return RoleFault(role, (rank,), method, kind, cause)
