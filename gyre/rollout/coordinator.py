"""Spread generation requests over rollout workers and gather the results in request order.

Prompt affinity: all ``n`` samples of a request go to one worker (its prompt is prefilled once there).
Requests are assigned greedily to the least-loaded worker by estimated token work, largest first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gyre.cluster.faults import CallClock, fault_from
from gyre.cluster.group import RoleGroup
from gyre.types import GenerationRequest, GenerationResult


def assign_requests(requests: Sequence[GenerationRequest], workers: int) -> list[list[int]]:
    """Request indices per worker, balancing n x (prompt + max new tokens); order kept within a worker."""
    loads = [0] * workers
    buckets: list[list[int]] = [[] for _ in range(workers)]
    work = [r.n * (len(r.prompt_ids) + r.params.max_new_tokens) for r in requests]
    for i in sorted(range(len(requests)), key=lambda i: -work[i]):
        w = min(range(workers), key=lambda k: (loads[k], k))
        buckets[w].append(i)
        loads[w] += work[i]
    return [sorted(b) for b in buckets]


class RolloutCoordinator:
    def __init__(self, group: RoleGroup, stream_parts: int = 8):
        self.group = group
        self.stream_parts = stream_parts

    def generate(self, requests: Sequence[GenerationRequest],
                 on_results: Callable[[list[GenerationResult]], None] | None = None,
                 label: str = "train") -> list[GenerationResult]:
        """All results, ordered by request then sample index. Workers stream finished samples back as they
        decode; ``on_results`` sees each part as it arrives (e.g. to start scoring it). A worker that dies
        or stalls past the watchdog's deadline raises ``RoleFault``; ``label`` keeps the usual durations of
        different kinds of generation (training, validation) apart."""
        import ray

        plan = assign_requests(requests, len(self.group))
        streams = {actor.generate_stream.remote([requests[i] for i in idx], self.stream_parts): rank
                   for rank, (actor, idx) in enumerate(zip(self.group.actors, plan)) if idx}
        clock = CallClock(self.group.watchdog, self.group.name, f"generate({label})")
        results: list[GenerationResult] = []
        while streams:
            if clock.expired():
                raise clock.hung(self.group.actors, sorted(streams.values()))
            ready, _ = ray.wait(list(streams), num_returns=1, timeout=clock.slice())
            clock.tick()
            for stream in ready:
                try:
                    part = ray.get(next(stream))
                except StopIteration:
                    del streams[stream]
                    continue
                except Exception as exc:  # noqa: BLE001 - a dead or failing engine, named in a RoleFault
                    raise fault_from(exc, self.group.name, streams[stream], f"generate({label})") from None
                results.extend(part)
                if on_results is not None:
                    on_results(part)
        clock.done()
        order = {r.request_id: i for i, r in enumerate(requests)}
        results.sort(key=lambda res: (order[res.request_id], res.sample_index))
        return results
