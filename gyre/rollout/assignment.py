"""Request assignment: which rollout engine serves which generation request.

Prompt affinity: all ``n`` samples of a request go to one worker (its prompt is prefilled once there).
Requests are assigned greedily to the least-loaded worker by estimated token work, largest first.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from gyre.types import GenerationRequest


def assign_requests(requests: Sequence[GenerationRequest], workers: int,
                    loads: Sequence[int] | None = None) -> list[list[int]]:
    """Request indices per worker, balancing n x (prompt + max new tokens) on top of each worker's
    current ``loads`` (same unit; default 0); order kept within a worker."""
    loads = list(loads) if loads is not None else [0] * workers
    buckets: list[list[int]] = [[] for _ in range(workers)]
    work = [r.n * (len(r.prompt_ids) + r.params.max_new_tokens) for r in requests]
    # A heap of (load, worker): the least-loaded worker, lowest index on ties, in log time (a simulated
    # cluster has a thousand engines and admits thousands of requests at once).
    heap = [(load, k) for k, load in enumerate(loads)]
    heapq.heapify(heap)
    for i in sorted(range(len(requests)), key=lambda i: -work[i]):
        load, w = heapq.heappop(heap)
        buckets[w].append(i)
        heapq.heappush(heap, (load + work[i], w))
    return [sorted(b) for b in buckets]
