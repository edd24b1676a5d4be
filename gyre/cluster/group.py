"""A role group: the Ray actors of one role, called together.

``call`` sends the same arguments to every worker, ``call_each`` one argument tuple per worker; both
block and return results in rank order, or raise ``RoleFault`` (a worker died, hung past its deadline,
or raised: see ``gyre.cluster.faults``). ``submit``/``submit_each`` return the object refs instead, so
the driver can overlap groups; ``gather`` waits on them with the same deadlines.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gyre.cluster.faults import PROBE, Watchdog, gather


class RoleGroup:
    def __init__(self, name: str, actors: list, devices: Sequence[int], spawn: Callable[[], Any] | None = None,
                 spawn_args: tuple | None = None, watchdog: Watchdog | None = None):
        self.name = name
        self.actors = actors
        self.devices = tuple(devices)
        self.spawn = spawn
        """Starts one more actor like the others (unplaced groups only: placed actors own a device share)."""
        self.spawn_args = spawn_args
        """The constructor arguments ``spawn`` passes."""
        self.watchdog = watchdog
        """Deadlines for this group's calls (shared by a run's groups); None waits without a deadline."""

    @classmethod
    def create(cls, name: str, worker_cls: type, placement, args_for_rank) -> RoleGroup:
        """One actor per device of ``name`` in the plan; ``args_for_rank(rank) -> (args, kwargs)``."""
        import ray

        remote_cls = ray.remote(concurrency_groups={PROBE: 1})(worker_cls)
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
        restarts a dead one up to ``max_restarts`` times."""
        import ray

        remote = ray.remote(concurrency_groups={PROBE: 1})(worker_cls)
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
        return self.gather(self.submit(method, *args, **kwargs), method)

    def call_each(self, method: str, per_worker: Sequence[tuple]) -> list:
        return self.gather(self.submit_each(method, per_worker), method)

    def gather(self, refs: Sequence, method: str) -> list:
        """Results of one ref per worker, in rank order, within the watchdog's deadline."""
        return gather(refs, self.name, method, self.actors, self.watchdog)

    def kill(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
