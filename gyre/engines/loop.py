"""The command loop in front of a rollout engine (ROLL Flash's "LLM proxy").

One thread runs ``serve``: between decoding steps it drains the commands other threads queued (add
requests, abort requests, update the weights, stop), advances the engine one step, and yields what
finished. Control calls therefore never wait for a batch to finish: an abort or a weight update takes
effect at the next step boundary. The Ray rollout actor runs ``serve`` as a streaming method in a
concurrency group of its own and the control methods in another; tests drive it with plain threads.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from gyre.types import GenerationRequest, GenerationResult


@dataclass
class _Command:
    kind: str
    """"add", "abort", "update" or "stop"."""
    requests: Sequence[GenerationRequest] = ()
    request_ids: Sequence[str] = ()
    load: Callable[[], int] | None = None
    """For "update": loads the new weights into the (suspended) engine, returns the version it holds."""
    partial: bool = True
    """For "update": keep in-flight requests and continue them under the new weights (False: abort them)."""
    done: threading.Event = field(default_factory=threading.Event)
    reply: object = None
    error: BaseException | None = None


class EngineLoop:
    def __init__(self, engine, emit_every: int = 1, emit_after_s: float = 0.05,
                 on_busy: Callable[[], None] | None = None, on_idle: Callable[[], None] | None = None,
                 spans=None):
        """``engine`` implements ``gyre.engines.base.RolloutEngine``. Finished samples are yielded once
        ``emit_every`` are ready, ``emit_after_s`` after the first of them, or when the engine goes idle.
        ``on_busy`` / ``on_idle`` run when decoding starts and stops (a hybrid policy switches its module
        between eval and train mode). ``spans``, a ``gyre.cluster.spans.SpanRecorder``, records decoding
        (consecutive steps merged into busy intervals) as "generate" and weight updates as "weight_sync"."""
        self.engine = engine
        self.emit_every, self.emit_after_s = max(1, emit_every), emit_after_s
        self.on_busy, self.on_idle = on_busy, on_idle
        self._commands: queue.Queue[_Command] = queue.Queue()
        self._running = False
        self._busy_s = 0.0
        self.spans = spans

    # ---- control (any thread) -------------------------------------------------------------------
    def add(self, requests: Sequence[GenerationRequest]) -> None:
        self._commands.put(_Command("add", requests=list(requests)))

    def abort(self, request_ids: Sequence[str]) -> None:
        """The aborted samples' tokens so far come back on the ``serve`` stream (finish_reason "abort")."""
        self._commands.put(_Command("abort", request_ids=list(request_ids)))

    def update(self, load: Callable[[], int], partial: bool = True, timeout_s: float | None = None) -> int:
        """Suspend at the next step boundary, run ``load``, resume; returns the version now held. Requests
        in flight continue under the new weights (``partial``) or are aborted and returned."""
        return self._wait(_Command("update", load=load, partial=partial), timeout_s)

    def stop(self, timeout_s: float | None = None) -> None:
        """End ``serve`` (what is unfinished is aborted and yielded first)."""
        if self._running:
            self._wait(_Command("stop"), timeout_s)

    def _wait(self, command: _Command, timeout_s: float | None):
        if not self._running:  # nobody serves: apply it here (the engine is idle between serve calls)
            self._apply(command, [])
        else:
            self._commands.put(command)
            if not command.done.wait(timeout_s):
                raise TimeoutError(f"the engine loop did not take a {command.kind!r} command in {timeout_s} s")
        if command.error is not None:
            raise command.error
        return command.reply

    def take_busy_s(self) -> float:
        """Seconds spent decoding since the last call (for the idle-fraction metrics)."""
        busy, self._busy_s = self._busy_s, 0.0
        return busy

    # ---- the loop (one thread) ------------------------------------------------------------------
    def serve(self, idle_poll_s: float = 0.05) -> Iterator[list[GenerationResult]]:
        self._running = True
        pending: list[GenerationResult] = []
        first_at = 0.0
        decoding = False
        try:
            while True:
                if not self._drain(pending, block_s=0.0 if self.engine.busy else idle_poll_s):
                    break
                if self.engine.busy:
                    if not decoding and self.on_busy:
                        self.on_busy()
                    decoding = True
                    t0 = time.time()
                    pending += self.engine.step()
                    t1 = time.time()
                    self._busy_s += t1 - t0
                    if self.spans is not None:
                        self.spans.add("generate", t0, t1)
                elif decoding:
                    decoding = False
                    if self.on_idle:
                        self.on_idle()
                if pending and not first_at:
                    first_at = time.monotonic()
                if pending and (len(pending) >= self.emit_every or not self.engine.busy
                                or time.monotonic() - first_at >= self.emit_after_s):
                    yield pending
                    pending, first_at = [], 0.0
            if pending:
                yield pending
        finally:
            self._running = False
            if decoding and self.on_idle:
                self.on_idle()
            self._fail_queued()

    def _fail_queued(self) -> None:
        """Commands nobody will apply now: their callers get an error instead of waiting forever."""
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            command.error = RuntimeError(f"the engine loop stopped before a {command.kind!r} command ran")
            command.done.set()

    def _drain(self, out: list, block_s: float) -> bool:
        """Apply every queued command (waiting up to ``block_s`` for the first); False on "stop"."""
        try:
            command = self._commands.get(timeout=block_s) if block_s > 0 else self._commands.get_nowait()
        except queue.Empty:
            return True
        while True:
            self._apply(command, out)
            if command.kind == "stop":
                return False
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _apply(self, command: _Command, out: list) -> None:
        engine = self.engine
        try:
            if command.kind == "add":
                engine.add(command.requests)
            elif command.kind == "abort":
                out += engine.abort(command.request_ids)
            elif command.kind == "update":
                t0 = time.time()
                engine.suspend()
                if not command.partial:
                    out += engine.abort(engine.request_ids())
                try:
                    command.reply = command.load()
                finally:  # a failed load is the caller's error; the engine must not stay suspended
                    engine.resume()
                    if self.spans is not None:
                        self.spans.add("weight_sync", t0, time.time())
            elif command.kind == "stop":
                out += engine.abort(engine.request_ids())
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller, the loop goes on
            command.error = exc
            if command.kind in ("add", "abort"):
                raise
        finally:
            command.done.set()
