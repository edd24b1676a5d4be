"""The rollout-engine protocol every backend (HF today, vLLM later) implements.

Per-request control, between decoding steps: ``add`` requests (they join the running batch),
``step`` (one token for every decoding row; returns the samples that finished), ``abort`` requests
(returns their tokens so far, to be continued as a request with that prefix), and ``suspend`` ->
``load_weights`` -> ``resume`` for a weight update with rows in flight (their tokens are kept and
re-prefilled). ``generate`` / ``generate_stream`` run a set of requests to completion on an idle engine.
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
        """Version of the weights currently loaded; stamped on every token sampled."""
        ...

    @property
    def busy(self) -> bool:
        """Some request is waiting or decoding."""
        ...

    def add(self, requests: Sequence[GenerationRequest]) -> None:
        """Queue requests; they join the running batch at the next step with room."""
        ...

    def step(self) -> list[GenerationResult]:
        """Admit queued requests, sample one token for every decoding row; the samples that finished."""
        ...

    def abort(self, request_ids: Sequence[str]) -> list[GenerationResult]:
        """Remove these requests; their unfinished samples so far, with finish_reason "abort"."""
        ...

    def request_ids(self) -> list[str]:
        """Requests with a sample waiting or decoding."""
        ...

    def suspend(self) -> None:
        """Stop decoding and free the KV cache; requests keep their tokens."""
        ...

    def resume(self) -> None:
        """Decode again, re-prefilling suspended requests (under the weights loaded meanwhile)."""
        ...

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Sample ``request.n`` responses for every request; results in request order, then sample index."""
        ...

    def generate_stream(self, requests: Sequence[GenerationRequest],
                        parts: int = 8) -> Iterator[list[GenerationResult]]:
        """The same results as ``generate``, yielded in parts as samples finish (what the actors serve)."""
        ...

    def load_weights(self, weights: Mapping[str, torch.Tensor], version: WeightVersion) -> None:
        """Replace the model weights (full, unsharded, HF parameter names) and set the version; only
        while no request is decoding (idle or suspended)."""
        ...

    def load_adapter(self, adapter, version: WeightVersion) -> None:
        """A LoRA policy's weight sync (``gyre.models.lora.AdapterWeights``): merge the adapters into the
        base weights the engine loaded and set the version; only while no request is decoding."""
        ...

    def offload(self) -> None:
        """Free device memory (weights to host, caches dropped) while another role uses the device."""
        ...

    def reload(self) -> None:
        """Undo ``offload``."""
        ...
