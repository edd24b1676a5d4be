"""Evaluate reward functions in child processes with a wall-clock limit per sample.

A reward that raises gets score 0 and status "error"; one that runs past ``timeout_s`` gets score 0,
status "timeout", and its process is killed and replaced. Either way the other samples and the run
go on. Child processes (not threads) are used because a hung or crashing Python function cannot be
stopped from inside its own process. Samples go to a child in chunks (one pipe message per chunk) and
come back one by one, so each sample still gets its own deadline.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

from gyre.rewards.base import RewardRequest, call_reward, load_function
from gyre.types import RewardResult

# Samples sent to a child in one message; small enough that work stays spread over the children.
_MAX_CHUNK = 32
# A child that dies this many times in a row before it is ready means the function cannot load.
_MAX_START_FAILURES = 3


def _serve(conn: Connection, spec: str, kwargs: dict) -> None:
    """Child-process loop: announce readiness, then for each chunk [(index, request), ...] send
    (index, result) per sample as soon as it is scored."""
    try:
        fn = load_function(spec)
    except BaseException:  # noqa: BLE001 - reported per sample below; the loop must start
        fn = None
    conn.send("ready")
    while True:
        try:
            chunk = conn.recv()
        except EOFError:
            return
        if chunk is None:
            return
        for index, request in chunk:
            start = time.perf_counter()
            try:
                fn = fn or load_function(spec)
                result = call_reward(fn, request, kwargs)
            except BaseException as exc:  # noqa: BLE001 - the sample fails, never the loop
                result = RewardResult.failed("error", f"{type(exc).__name__}: {exc}")
            result.latency_s = time.perf_counter() - start
            conn.send((index, result))


@dataclass
class _Child:
    process: mp.Process
    conn: Connection
    queue: deque = field(default_factory=deque)
    """Indices sent to this child and not answered yet; the first one is being scored now."""
    deadline: float = 0.0
    """When the sample being scored runs out of time (each sample gets timeout_s from its own start)."""
    ready: bool = False
    """False until the child has imported the reward function; start-up never counts against a sample."""


class RewardRunner:
    """A small pool of reward processes. ``score`` returns one RewardResult per request, in order."""

    def __init__(self, spec: str, kwargs: dict | None = None, timeout_s: float = 10.0, processes: int = 1):
        self.spec, self.kwargs = spec, dict(kwargs or {})
        self.timeout_s = timeout_s
        load_function(spec)  # fail now, in the caller, if the function cannot be imported
        self._ctx = mp.get_context("spawn")
        self._start_failures = 0
        self._children = [self._start() for _ in range(processes)]

    def _start(self) -> _Child:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_serve, args=(child, self.spec, self.kwargs), daemon=True)
        proc.start()
        child.close()
        return _Child(proc, parent)

    def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        results: list[RewardResult | None] = [None] * len(requests)
        pending = deque(range(len(requests)))
        while pending or any(c.queue for c in self._children):
            self._dispatch(pending, requests)
            waiting = [c for c in self._children if c.queue or not c.ready]
            deadlines = [c.deadline for c in waiting if c.queue]
            timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else self.timeout_s
            ready = wait([c.conn for c in waiting], timeout=timeout)
            for i, child in enumerate(self._children):
                if child.conn in ready and self._collect(child, results):
                    continue
                dead = not child.process.is_alive()
                if child.queue and (dead or time.monotonic() >= child.deadline):
                    results[child.queue.popleft()] = self._fail(child)
                    pending.extendleft(reversed(child.queue))  # the rest of its chunk is scored elsewhere
                    self._children[i] = self._start()
                elif dead:
                    self._restart_unready(i)
        return results  # type: ignore[return-value]

    def _dispatch(self, pending: deque, requests: list[RewardRequest]) -> None:
        """Send each idle child a chunk: one pipe message per chunk instead of per sample."""
        for child in [c for c in self._children if c.ready and not c.queue]:
            if not pending:
                return
            size = max(1, min(_MAX_CHUNK, -(-len(pending) // len(self._children))))
            child.queue = deque(pending.popleft() for _ in range(min(size, len(pending))))
            child.deadline = time.monotonic() + self.timeout_s
            child.conn.send([(i, requests[i]) for i in child.queue])

    def _collect(self, child: _Child, results: list) -> bool:
        """Read one message; False when the child's pipe is closed (it died)."""
        try:
            msg = child.conn.recv()
        except (EOFError, OSError):
            child.process.join(timeout=5)
            return False
        if msg == "ready":
            child.ready = True
            self._start_failures = 0
            return True
        index, result = msg
        results[index] = result
        child.queue.popleft()
        child.deadline = time.monotonic() + self.timeout_s
        return True

    def _restart_unready(self, i: int) -> None:
        self._start_failures += 1
        if self._start_failures > _MAX_START_FAILURES:
            raise RuntimeError(f"reward processes for {self.spec!r} keep dying before they are ready "
                               f"(exit code {self._children[i].process.exitcode})")
        self._children[i] = self._start()

    def _fail(self, child: _Child) -> RewardResult:
        alive = child.process.is_alive()
        child.process.kill()
        child.process.join(timeout=5)
        child.conn.close()
        if alive:
            result = RewardResult.failed("timeout", f"timeout after {self.timeout_s}s")
            result.latency_s = self.timeout_s
            return result
        return RewardResult.failed("error", f"reward process exited with code {child.process.exitcode}")

    def close(self) -> None:
        for child in self._children:
            try:
                child.conn.send(None)
            except OSError:
                pass
            child.process.join(timeout=2)
            if child.process.is_alive():
                child.process.kill()
        self._children = []
