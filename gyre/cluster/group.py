"""A role group: the Ray actors of one role, called together.

``call`` sends the same arguments to every worker, ``call_each`` one argument tuple per worker; both
block and return results in rank order. ``submit``/``submit_each`` return the object refs instead, so
the driver can overlap groups.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class RoleGroup:
    def __init__(self, name: str, actors: list, devices: Sequence[int], spawn: Callable[[], Any] | None = None,
                 spawn_args: tuple | None = None):
        self.name = name
        self.actors = actors
        self.devices = tuple(devices)
        self.spawn = spawn
        """Starts one more actor like the others (unplaced groups only: placed actors own a device share)."""
        self.spawn_args = spawn_args
        """The constructor arguments ``spawn`` passes."""

    @classmethod
    def create(cls, name: str, worker_cls: type, placement, args_for_rank) -> RoleGroup:
        """One actor per device of ``name`` in the plan; ``args_for_rank(rank) -> (args, kwargs)``."""
        import ray

        remote_cls = ray.remote(worker_cls)
        devices = placement.plan.roles.get(name)
        actors = []
        for rank, device in enumerate(devices):
            args, kwargs = args_for_rank(rank)
            options = placement.actor_options(name, device)
            actors.append(remote_cls.options(name=None, **options).remote(*args, **kwargs))
        return cls(name, actors, devices)

    @classmethod
    def create_unplaced(cls, name: str, worker_cls: type, count: int, num_cpus: float, args: tuple,
                        max_restarts: int = 0) -> RoleGroup:
        """Actors that hold no device (reward workers): Ray schedules them on any node with free CPUs, and
        restarts a dead one up to ``max_restarts`` times. A class's ``concurrency_groups`` attribute
        declares its Ray concurrency groups."""
        import ray

        groups = getattr(worker_cls, "concurrency_groups", None)
        remote = ray.remote(concurrency_groups=groups)(worker_cls) if groups else ray.remote(worker_cls)
        remote_cls = remote.options(num_cpus=num_cpus, max_restarts=max_restarts)

        def spawn():
            return remote_cls.remote(*args)

        return cls(name, [spawn() for _ in range(count)], (), spawn, args)

    def respawn(self, rank: int) -> None:
        """Kill actor ``rank`` for good (Ray kills even a stopped process within seconds) and put a fresh
        one in its place."""
        import ray

        if self.spawn is None:
            raise ValueError(f"{self.name}: only groups made by create_unplaced can start fresh actors")
        ray.kill(self.actors[rank], no_restart=True)
        self.actors[rank] = self.spawn()

    def __len__(self) -> int:
        return len(self.actors)

    def submit(self, method: str, *args: Any, **kwargs: Any) -> list:
        return [getattr(a, method).remote(*args, **kwargs) for a in self.actors]

    def submit_each(self, method: str, per_worker: Sequence[tuple]) -> list:
        if len(per_worker) != len(self.actors):
            raise ValueError(f"{self.name}: {len(per_worker)} argument sets for {len(self.actors)} workers")
        return [getattr(a, method).remote(*args) for a, args in zip(self.actors, per_worker)]

    def call(self, method: str, *args: Any, **kwargs: Any) -> list:
        import ray

        return ray.get(self.submit(method, *args, **kwargs))

    def call_each(self, method: str, per_worker: Sequence[tuple]) -> list:
        import ray

        return ray.get(self.submit_each(method, per_worker))

    def kill(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
