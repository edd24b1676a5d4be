"""In-process actors: a worker object in the driver's own process, called through the surface of a Ray
actor handle, so role groups, the reward pool and the rollout driver run in tests without Ray.

``LocalActor(cls, *args)`` builds ``cls(*args)`` on a thread of its own and runs its method calls there,
one at a time and in order, like a Ray actor: ``handle.method.remote(*args) -> LocalRef``. A generator
method returns a ``LocalStream`` whose parts arrive as the method yields them (Ray's streaming
generators). Calls in the ``PROBE`` concurrency group (``handle.method.options(concurrency_group=PROBE)``,
``handle.__ray_call__``) run on a second thread, so they answer while a call is running; a class's own
groups (``CONCURRENCY_GROUPS``, e.g. a rollout engine's serve loop) get a thread each. Arguments and
results are copied through pickle, as Ray serialises them: a worker never shares the driver's objects
(stricter than Ray's cloudpickle: lambdas and locally defined classes do not pass).

``transport.kill(actor)`` kills it: its queued and running calls fail with ``ActorLost`` at once (a
running call goes on to its end on its abandoned thread, since Python cannot stop a thread; its result is
dropped); with ``no_restart=False`` an actor with restarts left comes back as a fresh instance, like a
Ray actor whose process crashed. A constructor that raises leaves the actor dead, as in Ray. A dead
actor's process does not end here, so what a Ray actor's death takes with it (e.g. a reward worker's
child processes) is released by the worker's ``close()``, which its thread runs after its last call
when the class defines one.
"""

from __future__ import annotations

import inspect
import logging
import pickle
import queue
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from gyre.cluster import transport
from gyre.cluster.faults import PROBE
from gyre.cluster.transport import ActorLost, CallRaised, LocalRef, LocalStream, settle

log = logging.getLogger(__name__)
_CONSTRUCTING = threading.Lock()


def _lanes(cls: type) -> list[str]:
    """The threads an actor of ``cls`` runs calls on: "main", the probe group, and its own groups (e.g. a
    rollout engine's serve loop, ``cls.CONCURRENCY_GROUPS``)."""
    return ["main", PROBE, *getattr(cls, "CONCURRENCY_GROUPS", {})]


def _copy(value: Any) -> Any:
    """What the other side receives: a copy, as if sent over Ray."""
    return pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


@dataclass
class _Invocation:
    method: str
    args: tuple
    kwargs: dict
    out: Future | LocalStream


@dataclass
class _Life:
    """One life of the actor: its instance and its two threads (a restart starts a new life)."""

    number: int
    instance: Any = None
    dead: ActorLost | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    """Set once the constructor has run (calls in the probe group wait for it, as in Ray)."""
    queues: dict[str, queue.SimpleQueue] = field(default_factory=dict)
    """One queue (and thread) per lane: "main", ``PROBE``, and the class's own concurrency groups."""
    in_flight: list[Future | LocalStream] = field(default_factory=list)
    threads: dict[str, threading.Thread] = field(default_factory=dict)


class _Method:
    """``handle.method``: ``.remote(*args, **kwargs)`` calls it, ``.options(concurrency_group=...)``
    picks the thread."""

    def __init__(self, actor: LocalActor, name: str, lane: str = "main"):
        self._actor, self._name, self._lane = actor, name, lane

    def options(self, concurrency_group: str | None = None) -> _Method:
        lanes = _lanes(self._actor._cls)
        if concurrency_group is not None and concurrency_group not in lanes:
            raise ValueError(f"{self._actor._cls.__name__} actors have the concurrency groups {sorted(lanes)[1:]}; "
                             f"not {concurrency_group!r}")
        return _Method(self._actor, self._name, concurrency_group or "main")

    def remote(self, *args: Any, **kwargs: Any) -> LocalRef | LocalStream:
        return self._actor._submit(self._name, args, kwargs, self._lane)


class LocalActor:
    """An actor of ``cls`` in this process (see the module docstring)."""

    def __init__(self, cls: type, *args: Any, max_restarts: int = 0, **kwargs: Any):
        self._cls = cls
        self._init = _copy((args, kwargs))
        self._restarts_left = max_restarts
        self._lock = threading.Lock()
        self._life = self._start(0)

    def __repr__(self) -> str:
        return f"LocalActor({self._cls.__name__}, life {self._life.number})"

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("_") and name != "__ray_call__":
            raise AttributeError(name)
        if name != "__ray_call__" and not callable(getattr(self._cls, name, None)):
            raise AttributeError(f"{self._cls.__name__} actors have no method {name!r}")
        return _Method(self, name)

    @property
    def __ray_call__(self) -> _Method:
        """``__ray_call__.remote(fn, *args)`` runs ``fn(instance, *args)`` in the actor, as in Ray."""
        return _Method(self, "__ray_call__")

    def _submit(self, method: str, args: tuple, kwargs: dict, lane: str) -> LocalRef | LocalStream:
        stream = method != "__ray_call__" and inspect.isgeneratorfunction(getattr(self._cls, method))
        out: Future | LocalStream = LocalStream() if stream else Future()
        call = _Invocation(method, *_copy((args, kwargs)), out)
        with self._lock:
            life = self._life
            if life.dead is not None:
                _fail(out, life.dead)
            else:
                life.in_flight.append(out)
                life.queues[lane].put(call)
        return out if stream else LocalRef(out)

    def _kill(self, no_restart: bool = True) -> None:
        with self._lock:
            life = self._life
            if life.dead is not None:  # dead for good (a restart starts a new life at once)
                return
            restart = not no_restart and self._restarts_left > 0
            why = "crashed; restarting it" if restart else "was killed"
            self._end(life, ActorLost(f"The in-process actor {self._cls.__name__} {why} (transport.kill).",
                                      "ActorKilled", restarting=restart))
            if restart:
                self._restarts_left -= 1
                self._life = self._start(life.number + 1)
            else:
                self._restarts_left = 0

    # ---- its threads ------------------------------------------------------------------------------------
    def _start(self, number: int) -> _Life:
        life = _Life(number, queues={lane: queue.SimpleQueue() for lane in _lanes(self._cls)})
        for lane in life.queues:
            thread = threading.Thread(target=self._serve, args=(life, lane), daemon=True,
                                      name=f"{self._cls.__name__}-{number}-{lane}")
            life.threads[lane] = thread
        life.threads[PROBE].peer_lane = life.threads["main"]  # what probe_report inspects
        for thread in life.threads.values():
            thread.start()
        return life

    def _serve(self, life: _Life, lane: str) -> None:
        if lane == "main":
            self._construct(life)
        life.ready.wait()
        while life.dead is None:
            call = life.queues[lane].get()
            if call is not None and life.dead is None:
                self._run(life, call)
        close = getattr(life.instance, "close", None)
        if lane == "main" and callable(close):
            try:
                close()
            except Exception:  # noqa: BLE001 - the actor is dead already; its cleanup's failure is only logged
                log.warning("closing a dead in-process %s failed", self._cls.__name__, exc_info=True)

    def _construct(self, life: _Life) -> None:
        args, kwargs = _copy(self._init)
        try:
            with _CONSTRUCTING:  # one constructor at a time: lazy imports (transformers') race across threads
                life.instance = self._cls(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - the actor is dead, and every call says why
            with self._lock:
                self._restarts_left = 0
                self._end(life, ActorLost(f"The actor died because of an error raised in its creation task: "
                                          f"{_traceback(self._cls.__name__, exc)}", "ActorDiedError"))
        life.ready.set()

    def _run(self, life: _Life, call: _Invocation) -> None:
        if call.method == "__ray_call__":
            fn, *args = call.args
            method: Callable = lambda *a, **k: fn(life.instance, *a, **k)  # noqa: E731
        else:
            args, method = call.args, getattr(life.instance, call.method)
        value, error = None, None
        try:
            # As in Ray, a ref passed as an argument itself arrives as its value (one inside a list stays a ref).
            args = [transport.get(a) if isinstance(a, LocalRef) else a for a in args]
            kwargs = {k: transport.get(v) if isinstance(v, LocalRef) else v for k, v in call.kwargs.items()}
            if isinstance(call.out, LocalStream):
                parts = method(*args, **kwargs)
                for part in parts:
                    if life.dead is not None:
                        parts.close()  # killed mid-stream: the stream has failed already
                        break
                    call.out.put(_copy(part))
            else:
                value = _copy(method(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - the caller gets it, the actor lives on
            error = CallRaised(_traceback(f"{self._cls.__name__}.{call.method}", exc), type(exc).__name__, _lost(exc))
        with self._lock:
            if call.out not in life.in_flight:
                return  # the actor was killed meanwhile
            life.in_flight.remove(call.out)
        if isinstance(call.out, LocalStream):
            call.out.end(error)
        else:
            settle(call.out, value, error)

    @staticmethod
    def _end(life: _Life, why: ActorLost) -> None:
        """Fail every call of ``life`` and let its threads go (called with the lock held)."""
        life.dead = why
        for out in life.in_flight:
            _fail(out, why)
        life.in_flight.clear()
        for lane_queue in life.queues.values():
            lane_queue.put(None)
        life.ready.set()


def _fail(out: Future | LocalStream, error: BaseException) -> None:
    if isinstance(out, LocalStream):
        out.end(error)
    else:
        settle(out, error=error)


def _lost(exc: BaseException) -> str | None:
    """What was lost when a call failed because a ref it needed came from a dead actor (as Ray reports it)."""
    if isinstance(exc, ActorLost):
        return str(exc).splitlines()[0]
    return exc.lost if isinstance(exc, CallRaised) else None


def _traceback(what: str, exc: BaseException) -> str:
    """Like Ray's remote error text: where, the traceback, and the raised exception last (without the
    lines that only point at columns, which would crowd the short causes faults quote)."""
    lines = "".join(traceback.format_exception(exc)).splitlines()
    return "\n".join([f"{what}() (in-process)", *(line for line in lines if line.strip(" ^~"))])
