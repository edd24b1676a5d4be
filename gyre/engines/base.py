"""The rollout-engine protocol every backend (HF today, vLLM later) implements.

Requests carry ids, so the same protocol extends to per-request scheduling: a continuous-batching
engine adds ``add_request(request)``, ``abort(request_ids)`` and ``step() -> finished results``
between decoding steps, and ``generate`` becomes "add all, step until done". The batched ``generate``
and its streaming form ``generate_stream`` (finished samples first, so rewards overlap decoding) are
what the synchronous RLVR pipeline needs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol, runtime_checkable

import torch

from gyre.types import GenerationRequest, GenerationResult, WeightVersion


@runtime_checkable
class RolloutEngine(Protocol):
    @property
    def weight_version(self) -> WeightVersion:
        """Version of the weights currently loaded; stamped on every result."""
        ...

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Sample ``request.n`` responses for every request; results in request order, then sample index."""
        ...

    def generate_stream(self, requests: Sequence[GenerationRequest],
                        parts: int = 8) -> Iterator[list[GenerationResult]]:
        """The same results as ``generate``, yielded in parts as samples finish (what the actors serve)."""
        ...

    def load_weights(self, weights: Mapping[str, torch.Tensor], version: WeightVersion) -> None:
        """Replace the model weights (full, unsharded, HF parameter names) and set the version."""
        ...

    def offload(self) -> None:
        """Free device memory (weights to host, caches dropped) while another role uses the device."""
        ...

    def reload(self) -> None:
        """Undo ``offload``."""
        ...
