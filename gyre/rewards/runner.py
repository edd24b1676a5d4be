"""Evaluate reward functions in child processes with a deadline per sample.

A reward that raises gets score 0 and status "error"; one that runs past its deadline gets score 0,
status "timeout", and its process is killed and replaced. Either way the other samples and the run
go on. A sample's deadline is the function's own ``deadline_s(ground_truth, **kwargs)`` when it defines
one (the code reward derives it from its sandbox's limits), else the domain's ``timeout_s``.

A child that dies mid-sample (killed from outside, out of memory) or is found stopped (SIGSTOP) when
the deadline passes has failed for reasons outside the sample: it is replaced and the sample re-run
on a fresh child, at most ``MAX_RERUNS`` times, so a function that kills its own process every time
still ends as an "error" result. Child processes (not threads) are used because a hung or crashing
Python function cannot be stopped from inside its own process. Samples go to a child in chunks (one
pipe message per chunk) and come back one by one, so each sample still gets its own deadline.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

from gyre.rewards.base import RewardFn, RewardRequest, call_reward, load_function
from gyre.types import RewardResult

MAX_RERUNS = 2
"""Re-runs of a sample whose child died or was found stopped; the sample then ends as an error."""
CHILD_START_S = 60.0
"""A child that has not imported the reward function by then is killed and started again."""
# Samples sent to a child in one message; small enough that work stays spread over the children.
_MAX_CHUNK = 32
# A child that dies this many times in a row before it is ready means the function cannot load.
_MAX_START_FAILURES = 3


def sample_deadline(fn: RewardFn, request: RewardRequest, kwargs: dict, default_s: float) -> float:
    """Seconds one sample may run: ``fn.deadline_s(ground_truth, **kwargs)`` (with the keyword arguments
    the function gets for this sample) when ``fn`` defines it and it gives a number, else ``default_s``."""
    own = getattr(fn, "deadline_s", None)
    if not callable(own):
        return default_s
    try:
        value = own(request.ground_truth, **{**kwargs, **request.options})
    except Exception:  # noqa: BLE001 - a ground truth it cannot read fails the reward call itself, with its message
        return default_s
    if value is None:
        return default_s
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"deadline_s of reward function {getattr(fn, '__qualname__', fn)} returned {value!r}; "
                         "return a positive number of seconds, or None for the domain's timeout_s")
    return float(value)


@dataclass(frozen=True)
class RunnerSpec:
    """What a reward worker runs: the arguments of ``RewardRunner`` (and of ``RewardWorker``), in order."""

    function: str
    """"module:function" or "file.py:function"."""
    kwargs: dict
    """The domain's keyword arguments of the function."""
    timeout_s: float
    """The domain's deadline per sample, for functions without ``deadline_s``."""
    processes: int = 1
    """Child processes per worker: samples run this many at a time."""

    def deadlines(self, requests: list[RewardRequest]) -> list[float]:
        fn = load_function(self.function)
        return [sample_deadline(fn, r, self.kwargs, self.timeout_s) for r in requests]


@dataclass
class RunnerFaults:
    """Child processes lost to causes outside their sample; each such sample was re-run on a fresh child
    (until ``MAX_RERUNS``)."""

    child_deaths: int = 0
    """Died mid-sample: killed from outside, out of memory, or the function ended its own process."""
    child_stops: int = 0
    """Found stopped (state T) when a sample's deadline passed, or when it was about to get work."""


@dataclass
class ScoreReply:
    """A reward worker's answer to one call: results in request order, and the child faults it survived."""

    results: list[RewardResult]
    faults: RunnerFaults
    pid: int = 0
    """The worker's process id: a new one means the worker died and was restarted since the last answer."""


def die_with_parent(parent: int) -> None:
    """Ask Linux to kill this process when its parent dies (strictly: when the parent's thread that
    started it ends; a reward worker's Ray threads live as long as the worker): a worker killed from
    outside cannot stop its children, and one busy in a reward that never returns would live on.
    Elsewhere an idle child still exits when its pipe closes."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _serve(conn: Connection, spec: str, kwargs: dict, parent: int) -> None:
    """Child-process loop: announce readiness, then for each chunk [(index, request), ...] send
    (index, result) per sample as soon as it is scored."""
    die_with_parent(parent)
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


def _is_stopped(pid: int) -> bool:
    """Whether the process is stopped by a signal or a tracer (state T or t in /proc/<pid>/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


@dataclass
class _Child:
    process: mp.Process
    conn: Connection
    started: float = field(default_factory=time.monotonic)
    queue: deque = field(default_factory=deque)
    """Indices sent to this child and not answered yet; the first one is being scored now."""
    deadline: float = 0.0
    """When the sample being scored runs out of time (each sample's deadline counts from its own start)."""
    ready: bool = False
    """False until the child has imported the reward function; start-up never counts against a sample."""


@dataclass
class _ScoreCall:
    """One ``score`` call: its requests, each sample's deadline and re-runs, and the results so far."""

    requests: list[RewardRequest]
    deadlines: list[float]
    results: list[RewardResult | None] = field(init=False)
    pending: deque = field(init=False)
    reruns: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.results = [None] * len(self.requests)
        self.pending = deque(range(len(self.requests)))
        self.reruns = [0] * len(self.requests)


class RewardRunner:
    """A small pool of reward processes. ``score`` returns one RewardResult per request, in order."""

    def __init__(self, spec: str, kwargs: dict | None = None, timeout_s: float = 10.0, processes: int = 1):
        self.spec = RunnerSpec(spec, dict(kwargs or {}), timeout_s, processes)
        load_function(spec)  # fail now, in the caller, if the function cannot be imported
        self.faults = RunnerFaults()
        # Spawned, never forked: the worker is multi-threaded (Ray), and a fork server would be one more
        # process whose death or stop every child start and exit status depends on.
        self._ctx = mp.get_context("spawn")
        self._start_failures = 0
        self._children = [self._start() for _ in range(processes)]

    def _start(self) -> _Child:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_serve, args=(child, self.spec.function, self.spec.kwargs, os.getpid()),
                                 daemon=True)
        proc.start()
        child.close()
        return _Child(proc, parent)

    def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        batch = _ScoreCall(requests, self.spec.deadlines(requests))
        try:
            while batch.pending or any(c.queue for c in self._children):
                self._dispatch(batch)
                ready = wait([c.conn for c in self._children], timeout=self._until_next_deadline())
                for i, child in enumerate(self._children):
                    if child.conn in ready and self._collect(child, batch):
                        continue
                    self._check(i, child, batch)
        except BaseException:
            # Children still busy with this batch would answer into the next one.
            for i, child in enumerate(self._children):
                if child.queue:
                    self._kill(child)
                    self._children[i] = self._start()
            raise
        return batch.results  # type: ignore[return-value]

    def take_faults(self) -> RunnerFaults:
        """The child faults since the last call, and start counting again."""
        faults, self.faults = self.faults, RunnerFaults()
        return faults

    def child_pids(self) -> list[int]:
        return [c.process.pid for c in self._children]

    def _until_next_deadline(self) -> float:
        ends = [c.deadline if c.queue else c.started + CHILD_START_S for c in self._children if c.queue or not c.ready]
        return max(0.0, min(ends) - time.monotonic()) if ends else CHILD_START_S

    def _dispatch(self, batch: _ScoreCall) -> None:
        """Send each idle child a chunk: one pipe message per chunk instead of per sample."""
        for n, child in enumerate(self._children):
            if not batch.pending:
                return
            if not child.ready or child.queue:
                continue
            if _is_stopped(child.process.pid):  # a large chunk would block the send for ever
                self.faults.child_stops += 1
                self._kill(child)
                self._children[n] = self._start()
                continue
            size = max(1, min(_MAX_CHUNK, -(-len(batch.pending) // len(self._children))))
            child.queue = deque(batch.pending.popleft() for _ in range(min(size, len(batch.pending))))
            child.deadline = time.monotonic() + batch.deadlines[child.queue[0]]
            child.conn.send([(i, batch.requests[i]) for i in child.queue])

    def _collect(self, child: _Child, batch: _ScoreCall) -> bool:
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
        batch.results[index] = result
        child.queue.popleft()
        if child.queue:
            child.deadline = time.monotonic() + batch.deadlines[child.queue[0]]
        return True

    def _check(self, i: int, child: _Child, batch: _ScoreCall) -> None:
        """Replace a child that died, ran past its sample's deadline or never got ready."""
        alive = child.process.is_alive()
        if child.queue and (not alive or time.monotonic() >= child.deadline):
            self._end_sample(child, batch, alive)
            self._children[i] = self._start()
        elif not alive and child.ready:  # died between samples: nothing of this batch was lost
            self.faults.child_deaths += 1
            self._kill(child)
            self._children[i] = self._start()
        elif not child.ready and (not alive or time.monotonic() >= child.started + CHILD_START_S):
            self._kill(child)
            self._restart_unready(i)

    def _end_sample(self, child: _Child, batch: _ScoreCall, alive: bool) -> None:
        """The sample being scored timed out, or its child died or was stopped (then it is re-run)."""
        index = child.queue.popleft()
        stopped = alive and _is_stopped(child.process.pid)
        self._kill(child)
        batch.pending.extendleft(reversed(child.queue))  # the rest of its chunk is scored elsewhere
        if alive and not stopped:
            batch.results[index] = RewardResult.failed("timeout", f"timeout after {batch.deadlines[index]:g}s")
            batch.results[index].latency_s = batch.deadlines[index]
            return
        if stopped:
            self.faults.child_stops += 1
            cause = "was found stopped at its deadline"
        else:
            self.faults.child_deaths += 1
            cause = f"exited with code {child.process.exitcode}"
        if batch.reruns[index] < MAX_RERUNS:
            batch.reruns[index] += 1
            batch.pending.appendleft(index)
        else:
            batch.results[index] = RewardResult.failed("error", f"reward process {cause}; the sample ran "
                                                                f"{MAX_RERUNS + 1} times, each on a fresh process")

    def _restart_unready(self, i: int) -> None:
        self._start_failures += 1
        if self._start_failures > _MAX_START_FAILURES:
            raise RuntimeError(f"reward processes for {self.spec.function!r} keep dying before they are ready "
                               f"(exit code {self._children[i].process.exitcode})")
        self._children[i] = self._start()

    @staticmethod
    def _kill(child: _Child) -> None:
        child.process.kill()
        child.process.join(timeout=5)
        child.conn.close()

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
