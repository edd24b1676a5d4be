"""A role group: the actors of one role, called together.

``call`` sends the same arguments to every worker, ``call_each`` one argument tuple per worker; both
block and return results in rank order, or raise ``RoleFault`` (a worker died, hung past its deadline,
or raised: see ``gyre.cluster.faults``). ``submit``/``submit_each`` return the refs instead, so the
driver can overlap groups; ``gather`` waits on them with the same deadlines. A method is named by the
worker class's method itself (``group.call(PolicyWorker.save_checkpoint, path)``), never by a string: a
reader jumps to the definition, and a renamed method fails where it is called, not in a remote worker.
A call every role answers alike names the ``Protocol`` that declares it (``Offloadable.offload``).

A group may have vacant ranks (``vacate``: a lent rollout engine taken back) and grow (``attach``): calls
go to the live ranks (``live``), in rank order, and ``len`` counts every rank the group has had, so a rank
names one actor for the whole run.

The actors are Ray actors (``create``, ``create_unplaced``) or in-process ones (``local``,
``local_unplaced``: ``gyre.cluster.local``, for tests without Ray); the group waits on both through
``gyre.cluster.transport``, so everything built on it runs the same over either.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from gyre.cluster import transport
from gyre.cluster.faults import PROBE, Watchdog, gather

T = TypeVar("T")
Method = Callable[..., T]
"""A worker method: ``WorkerClass.method``, or ``SomeProtocol.method`` for a call several worker classes
answer (go-to-definition works either way)."""


class RoleGroup:
    def __init__(self, name: str, actors: list, devices: Sequence[int], spawn: Callable[[int], Any] | None = None,
                 spawn_args: tuple | None = None, watchdog: Watchdog | None = None, worker_cls: type | None = None):
        self.name = name
        self.actors = actors
        self.devices = tuple(devices)
        self.spawn = spawn
        """``spawn(rank)`` starts a fresh actor for ``rank``, like the one it replaces (same device share)."""
        self.spawn_args = spawn_args
        """The constructor arguments ``spawn`` passes."""
        self.watchdog = watchdog
        """Deadlines for this group's calls (shared by a run's groups); None waits without a deadline."""
        self.worker_cls = worker_cls
        """The actors' class, when known: a method reference must be one of its methods."""

    @classmethod
    def create(cls, name: str, worker_cls: type, placement, args_for_rank) -> RoleGroup:
        """One actor per worker of ``name`` in the plan (per device, or per tensor-parallel engine's devices);
        ``args_for_rank(rank) -> (args, kwargs)``."""
        import ray

        remote_cls = ray.remote(concurrency_groups=_groups(worker_cls))(worker_cls)
        workers = placement.worker_devices(name)

        def spawn(rank: int):
            args, kwargs = args_for_rank(rank)
            options = placement.actor_options(name, workers[rank][0])
            return remote_cls.options(name=None, **options).remote(*args, **kwargs)

        return cls(name, [spawn(rank) for rank in range(len(workers))], [d for w in workers for d in w], spawn,
                   worker_cls=worker_cls)

    @classmethod
    def create_unplaced(cls, name: str, worker_cls: type, count: int, num_cpus: float, args: tuple,
                        max_restarts: int = 0) -> RoleGroup:
        """Actors that hold no device (reward workers): Ray schedules them on any node with free CPUs, and
        restarts a dead one up to ``max_restarts`` times."""
        import ray

        remote = ray.remote(concurrency_groups=_groups(worker_cls))(worker_cls)
        remote_cls = remote.options(num_cpus=num_cpus, max_restarts=max_restarts)

        def spawn(rank: int):
            return remote_cls.remote(*args)

        return cls(name, [spawn(rank) for rank in range(count)], (), spawn, args, worker_cls=worker_cls)

    @classmethod
    def local(cls, name: str, worker_cls: type, args_per_rank: Sequence[tuple], watchdog: Watchdog | None = None,
              ) -> RoleGroup:
        """In-process actors (``gyre.cluster.local``), one per argument tuple, holding no device."""
        from gyre.cluster.local import LocalActor

        def spawn(rank: int):
            return LocalActor(worker_cls, *args_per_rank[rank])

        return cls(name, [spawn(rank) for rank in range(len(args_per_rank))], (), spawn, watchdog=watchdog,
                   worker_cls=worker_cls)

    @classmethod
    def local_unplaced(cls, name: str, worker_cls: type, count: int, args: tuple, max_restarts: int = 0) -> RoleGroup:
        """``create_unplaced`` in this process: the same arguments and restarts, and ``respawn``."""
        from gyre.cluster.local import LocalActor

        def spawn(rank: int):
            return LocalActor(worker_cls, *args, max_restarts=max_restarts)

        return cls(name, [spawn(rank) for rank in range(count)], (), spawn, args, worker_cls=worker_cls)

    @property
    def live(self) -> list[int]:
        """The ranks that hold an actor (all of them, unless some were vacated)."""
        return [rank for rank, actor in enumerate(self.actors) if actor is not None]

    def attach(self, actor) -> int:
        """Add ``actor`` (started elsewhere: a lent engine) as the next rank; returns its rank."""
        self.actors.append(actor)
        return len(self.actors) - 1

    def vacate(self, rank: int) -> None:
        """Kill actor ``rank`` for good and leave its rank empty (calls skip it from now on)."""
        actor, self.actors[rank] = self.actors[rank], None
        if actor is not None:
            transport.kill(actor, no_restart=True)

    def respawn(self, rank: int) -> None:
        """Kill actor ``rank`` for good (Ray kills even a stopped process within seconds) and put a fresh
        one in its place."""
        if self.spawn is None:
            raise ValueError(f"{self.name}: this group cannot start fresh actors (it was made from given actors)")
        transport.kill(self.actors[rank], no_restart=True)
        self.actors[rank] = self.spawn(rank)

    def __len__(self) -> int:
        return len(self.actors)

    def method_name(self, method: Method) -> str:
        """The remote name of ``method``, checked against the workers' class when it is known: its own
        method, or one of a ``Protocol`` the class answers."""
        name = transport.method_name(method)
        if self.worker_cls is not None and getattr(self.worker_cls, name, None) is not method \
                and not (_declared_by_protocol(method) and callable(getattr(self.worker_cls, name, None))):
            raise TypeError(f"{self.name}: {getattr(method, '__qualname__', name)} is not a method of its "
                            f"workers' class {self.worker_cls.__name__}")
        return name

    def submit(self, method: Method[T], *args: Any, **kwargs: Any) -> list:
        """One call per live rank, in rank order."""
        name = self.method_name(method)
        return [getattr(a, name).remote(*args, **kwargs) for a in self.actors if a is not None]

    def submit_each(self, method: Method[T], per_worker: Sequence[tuple]) -> list:
        """One call per live rank with its own arguments, in rank order."""
        actors = [a for a in self.actors if a is not None]
        if len(per_worker) != len(actors):
            raise ValueError(f"{self.name}: {len(per_worker)} argument sets for {len(actors)} workers")
        name = self.method_name(method)
        return [getattr(a, name).remote(*args) for a, args in zip(actors, per_worker)]

    def submit_detached(self, actor, method: Method[T], *args: Any, **kwargs: Any):
        """A call to ``actor``, one of this group's kind not (yet) in it: an engine still joining."""
        return getattr(actor, self.method_name(method)).remote(*args, **kwargs)

    def submit_to(self, rank: int, method: Method[T], *args: Any, probe: bool = False, lane: str | None = None,
                  **kwargs: Any):
        """One call to worker ``rank``; ``probe`` runs it on the worker's probe thread (``PROBE``), beside
        whatever call is running; ``lane`` on another concurrency group of the worker's class."""
        remote = getattr(self.actors[rank], self.method_name(method))
        lane = PROBE if probe else lane
        return (remote.options(concurrency_group=lane) if lane else remote).remote(*args, **kwargs)

    def call(self, method: Method[T], *args: Any, **kwargs: Any) -> list[T]:
        return self.gather(self.submit(method, *args, **kwargs), method)

    def call_each(self, method: Method[T], per_worker: Sequence[tuple]) -> list[T]:
        return self.gather(self.submit_each(method, per_worker), method)

    def gather(self, refs: Sequence, method: Method, ranks: Sequence[int] | None = None) -> list:
        """Results of one ref per live worker (or per rank of ``ranks``), in order, within the watchdog's deadline."""
        if ranks is None and None in self.actors and len(refs) == len(self.live):  # one per live rank
            ranks = self.live
        return gather(refs, self.name, transport.method_name(method), self.actors, self.watchdog, ranks)

    def kill(self) -> None:
        for actor in self.actors:
            if actor is not None:
                transport.kill(actor)
        self.actors = []


def starter(worker_cls: type, options: dict, args_for: Callable[[int], tuple]) -> Callable[[int], Any]:
    """``start(rank)`` starts a ``worker_cls`` actor outside the run's placement group, where Ray finds the
    resources of ``options`` free (lent rollout engines); a group takes it in with ``attach``."""
    import ray

    remote_cls = ray.remote(concurrency_groups=_groups(worker_cls))(worker_cls).options(**options)
    return lambda rank: remote_cls.remote(*args_for(rank))


def _declared_by_protocol(method: Callable) -> bool:
    """``method`` is declared by a ``typing.Protocol`` class (found from its qualified name)."""
    owner: Any = sys.modules.get(getattr(method, "__module__", ""), None)
    for part in getattr(method, "__qualname__", "").split(".")[:-1]:
        owner = getattr(owner, part, None)
    return isinstance(owner, type) and bool(getattr(owner, "_is_protocol", False))


def _groups(worker_cls: type) -> dict[str, int]:
    """Ray concurrency groups of an actor class: the probe lane, and the class's own (a served engine's loop)."""
    return {PROBE: 1, **getattr(worker_cls, "CONCURRENCY_GROUPS", {})}
