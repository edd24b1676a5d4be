"""Request assignment: which rollout engine serves which generation request.

Prompt affinity: all ``n`` samples of a request go to one worker (its prompt is prefilled once there).
Requests are assigned greedily to the least-loaded worker by estimated token work, largest first.
"""

from __future__ import annotations

from collections.abc import Sequence

from gyre.types import GenerationRequest


def assign_requests(requests: Sequence[GenerationRequest], workers: int,
                    loads: Sequence[int] | None = None) -> list[list[int]]:
    """Request indices per worker, balancing n x (prompt + max new tokens) on top of each worker's
    current ``loads`` (same unit; default 0); order kept within a worker."""
    loads = list(loads) if loads is not None else [0] * workers
    buckets: list[list[int]] = [[] for _ in range(workers)]
    work = [r.n * (len(r.prompt_ids) + r.params.max_new_tokens) for r in requests]
    for i in sorted(range(len(requests)), key=lambda i: -work[i]):
        w = min(range(workers), key=lambda k: (loads[k], k))
        buckets[w].append(i)
        loads[w] += work[i]
    return [sorted(b) for b in buckets]
