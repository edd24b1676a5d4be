"""How the driver waits on remote calls, whichever kind of actor answers them: Ray's object refs and
streams, or the in-process refs of ``gyre.cluster.local`` (actors run on threads of the driver's own
process, for tests and simulations that need no Ray).

The few operations the driver needs, for both kinds (and mixtures of them):

- ``wait(refs, num_returns, timeout) -> (ready, rest)``, like ``ray.wait``; a stream is ready when its
  next part (or its end) has arrived;
- ``get(ref, timeout)``: a call's result, or one of the errors below;
- ``next_part(stream)``: the next part of a generator method's stream, or ``STREAM_END``;
- ``kill(actor, no_restart)``; ``method_name(method)``: the remote name of ``Worker.method``.

A failed call raises one of three errors, whatever the actor's kind, so fault handling is written once:

- ``CallRaised``: the method raised; the actor lives (``lost`` is set when it raised because something
  it needed was lost: an object's owner, a node);
- ``ActorLost``: the actor's process is gone (killed, out of memory, its node lost), or unreachable for
  now (``restarting``: Ray restarts it, and it will answer again);
- ``RemoteError`` itself: the transport failed otherwise (Ray's object store, a cancelled task).

``str()`` of each is the original error's text (for Ray, its remote traceback), so fault reports read
the same as Ray's own; ``origin`` names the original error's type.
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, InvalidStateError
from concurrent.futures import wait as wait_futures
from typing import Any


class _StreamEnd:
    def __repr__(self) -> str:
        return "STREAM_END"


STREAM_END = _StreamEnd()
"""What ``next_part`` returns once a stream's generator has returned."""
_MIXED_SLICE_S = 0.01
"""Longest single wait on one kind of ref while waiting on Ray and in-process refs together."""


class RemoteError(Exception):
    """A remote call failed (see the module docstring for its two kinds)."""

    def __init__(self, text: str, origin: str):
        super().__init__(text)
        self.origin = origin
        """The original error's type name (e.g. ``ActorDiedError``, ``ValueError``)."""


class CallRaised(RemoteError):
    """The method raised; the actor lives."""

    def __init__(self, text: str, origin: str, lost: str | None = None):
        super().__init__(text, origin)
        self.lost = lost
        """Set when the call failed because something it needed was lost: what, in one line."""


class ActorLost(RemoteError):
    """The actor's process is gone, or unreachable for now."""

    def __init__(self, text: str, origin: str, restarting: bool = False):
        super().__init__(text, origin)
        self.restarting = restarting
        """It may come back (Ray is restarting it); calls to it will be answered again."""


def method_name(method: Callable) -> str:
    """The remote name of a worker method such as ``PolicyWorker.train`` (Ray addresses actor methods by
    name; gyre's callers pass the method itself, so a reader jumps to the definition)."""
    name = getattr(method, "__name__", None)
    if isinstance(method, str) or not callable(method) or not name:
        raise TypeError(f"a remote method is a worker class's method (e.g. PolicyWorker.train), not {method!r}")
    return name


# ---- in-process refs --------------------------------------------------------------------------------

_REFS: weakref.WeakValueDictionary[int, Future] = weakref.WeakValueDictionary()
"""Futures of live in-process refs by id: a ref inside a call's arguments is pickled (calls copy their
arguments like Ray does) and must come back as the same ref."""
_ref_ids = iter(range(1, sys.maxsize))
_ids_lock = threading.Lock()


def settle(future: Future, value: Any = None, error: BaseException | None = None) -> bool:
    """Set a future's outcome unless it has one already (a killed actor's late answer is dropped)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)
    except InvalidStateError:
        return False
    return True


class LocalRef:
    """The result of one in-process call (or one part of a stream), settled by the actor's thread."""

    __slots__ = ("future", "id", "__weakref__")

    def __init__(self, future: Future | None = None):
        self.future = future if future is not None else Future()
        with _ids_lock:
            self.id = next(_ref_ids)
        _REFS[self.id] = self.future

    def __reduce__(self):
        return _ref_from_id, (self.id,)

    def __repr__(self) -> str:
        state = "ready" if self.future.done() else "pending"
        return f"LocalRef({self.id}, {state})"


def _ref_from_id(ref_id: int) -> LocalRef:
    ref = LocalRef.__new__(LocalRef)
    ref.id, ref.future = ref_id, _REFS[ref_id]
    return ref


class LocalStream:
    """The parts of an in-process generator call, like Ray's ``ObjectRefGenerator``: ``next()`` gives
    one ``LocalRef`` per part as the method yields it, then raises StopIteration. After a failure
    (the method raised, the actor was killed) it gives one failed ref, then stops."""

    _END = object()

    def __init__(self):
        self._lock = threading.Lock()
        self._parts: deque[Future] = deque([Future()])
        """Head: the consumer's next part; tail: the part the producer fills next."""
        self._closed = False

    # producer side (the actor's thread, or a kill)
    def put(self, value: Any) -> None:
        with self._lock:
            if not self._closed:
                self._parts.append(Future())
                settle(self._parts[-2], value)

    def end(self, error: BaseException | None = None) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if error is not None:
                self._parts.append(Future())
                settle(self._parts[-2], error=error)
            settle(self._parts[-1], self._END)

    # consumer side (the driver)
    def head(self) -> Future:
        return self._parts[0]

    def __iter__(self) -> LocalStream:
        return self

    def __next__(self) -> LocalRef:
        head = self._parts[0]
        if head.exception() is None and head.result() is self._END:
            raise StopIteration
        with self._lock:
            self._parts.popleft()
        return LocalRef(head)


def _is_local(ref: Any) -> bool:
    return isinstance(ref, (LocalRef, LocalStream))


def _future(ref: LocalRef | LocalStream) -> Future:
    return ref.future if isinstance(ref, LocalRef) else ref.head()


# ---- the operations -----------------------------------------------------------------------------------

def wait(refs: Sequence, num_returns: int = 1, timeout: float | None = None) -> tuple[list, list]:
    """Like ``ray.wait``: returns when ``num_returns`` of ``refs`` are ready or ``timeout`` seconds have
    passed; (at most ``num_returns`` ready refs, the others), each in the order given."""
    refs = list(refs)
    if num_returns > len(refs):
        raise ValueError(f"num_returns ({num_returns}) is more than the {len(refs)} refs given")
    local = [r for r in refs if _is_local(r)]
    if not local:
        if not refs:
            return [], []
        import ray

        return ray.wait(refs, num_returns=num_returns, timeout=timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    remote = [r for r in refs if not _is_local(r)]
    while True:
        ready = {id(r) for r in local if _future(r).done()}
        if remote:
            import ray

            ready |= {id(r) for r in ray.wait(remote, num_returns=len(remote), timeout=0)[0]}
        left = None if deadline is None else deadline - time.monotonic()
        if len(ready) >= num_returns or (left is not None and left <= 0):
            break
        if remote:  # both kinds: look at each in short turns
            left = _MIXED_SLICE_S if left is None else min(left, _MIXED_SLICE_S)
        pending = [_future(r) for r in local if id(r) not in ready]
        if pending:
            wait_futures(pending, timeout=left, return_when=FIRST_COMPLETED)
        else:  # only Ray refs left to wait for
            time.sleep(left)
    chosen = [r for r in refs if id(r) in ready][:num_returns]
    taken = {id(r) for r in chosen}
    return chosen, [r for r in refs if id(r) not in taken]


def get(ref: Any, timeout: float | None = None) -> Any:
    """The result of one call; raises ``CallRaised``, ``ActorLost`` or ``RemoteError`` when it failed,
    TimeoutError when it is not ready within ``timeout`` seconds."""
    if isinstance(ref, LocalRef):
        try:
            return ref.future.result(timeout)
        except TimeoutError:
            raise TimeoutError(f"{ref} not ready after {timeout} s") from None
    import ray

    try:
        return ray.get(ref, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise
    except ray.exceptions.RayError as exc:
        raise _from_ray(exc) from exc


def next_part(stream: Any) -> Any:
    """The next part of a generator method's stream, or ``STREAM_END`` once the method has returned.
    Blocks until the part arrives: call it for a stream that ``wait`` returned as ready."""
    if isinstance(stream, LocalStream):
        try:
            return get(next(stream))
        except StopIteration:
            return STREAM_END
    import ray

    try:
        ref = next(stream)
    except StopIteration:
        return STREAM_END
    except ray.exceptions.RayError as exc:
        raise _from_ray(exc) from exc
    return get(ref)


def kill(actor: Any, no_restart: bool = True) -> None:
    """Kill an actor; with ``no_restart=False`` it is restarted when it has restarts left (a crash)."""
    from gyre.cluster.local import LocalActor

    if isinstance(actor, LocalActor):
        actor._kill(no_restart)
        return
    import ray

    ray.kill(actor, no_restart=no_restart)


def translate(exc: BaseException) -> BaseException:
    """``exc`` as one of this module's errors when it is Ray's (for callers that called Ray directly);
    any other exception as it is."""
    ray = sys.modules.get("ray")
    if ray is not None and isinstance(exc, ray.exceptions.RayError) \
            and not isinstance(exc, ray.exceptions.GetTimeoutError):
        return _from_ray(exc)
    return exc


def _from_ray(exc: BaseException) -> RemoteError:
    """Ray's error as one of this module's (same text; the original stays as ``__cause__``)."""
    import ray.exceptions as rex

    lost = (rex.RayActorError, rex.ActorUnavailableError, rex.WorkerCrashedError, rex.ObjectLostError,
            rex.OwnerDiedError, rex.NodeDiedError, rex.LocalRayletDiedError, rex.OutOfMemoryError)
    text, origin = str(exc), type(exc).__name__
    if isinstance(exc, lost):
        return ActorLost(text, origin, restarting=isinstance(exc, rex.ActorUnavailableError))
    if not isinstance(exc, rex.RayTaskError):
        return RemoteError(text, origin)
    cause = exc
    while isinstance(cause, rex.RayTaskError) and getattr(cause, "cause", None) is not None \
            and cause.cause is not cause:
        cause = cause.cause  # a task that failed because something it needed died (e.g. weights' owner)
    if isinstance(cause, lost):
        lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
        return CallRaised(text, origin, lost=lines[0][:300] if lines else type(cause).__name__)
    return CallRaised(text, origin)
