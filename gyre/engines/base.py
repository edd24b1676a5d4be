"""The rollout-engine protocol every backend (HF, vLLM) implements.

Per-request control, between decoding steps: ``add`` requests (they join the running batch),
``step`` (one token for every decoding row; returns the samples that finished), ``abort`` requests
(returns their tokens so far, to be continued as a request with that prefix), and ``suspend`` ->
``load_weights`` -> ``resume`` for a weight update with rows in flight (their tokens are kept and
re-prefilled). ``generate`` / ``generate_stream`` run a set of requests to completion on an idle engine.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
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

    def reload(self, values: bool = True) -> None:
        """Undo ``offload``; ``values=False``: a whole new version loads next, so the old weights need not
        come back (an engine may bring them anyway)."""
        ...


class StepwiseGenerate:
    """``generate`` and ``generate_stream`` for any engine with ``add`` / ``step`` / ``busy``: the batched,
    synchronous path is the per-request one run to completion, so the two cannot disagree."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        results = [res for part in self.generate_stream(requests, parts=1) for res in part]
        order = {r.request_id: i for i, r in enumerate(requests)}
        results.sort(key=lambda res: (order[res.request_id], res.sample_index))
        return results

    def generate_stream(self, requests: Sequence[GenerationRequest],
                        parts: int = 8) -> Iterator[list[GenerationResult]]:
        """Run ``requests`` to completion, handing out finished samples in about ``parts`` parts, so
        rewards can start on early finishers while the rest still decode (1: everything at the end)."""
        if self.busy:
            raise RuntimeError("generate_stream needs an idle engine: it runs its requests to completion")
        self.add(requests)
        emit_every = max(1, sum(r.n for r in requests) // parts)
        done: list[GenerationResult] = []
        while self.busy:
            done += self.step()
            if len(done) >= emit_every:
                yield done
                done = []
        if done:
            yield done


@dataclass
class SampleProgress:
    """One sample while an engine generates it: what it sampled so far, across the steps (and, after a
    suspend, the engine requests) that carried it."""

    request: GenerationRequest
    sample_index: int
    tokens: list[int] = field(default_factory=list)
    """Sampled by this request, after its prefix."""
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: str | None = None

    @property
    def response(self) -> list[int]:
        return [*self.request.prefix, *self.tokens]

    @property
    def context(self) -> list[int]:
        """What a prefill must encode to sample this sample's next token."""
        return [*self.request.prompt_ids, *self.request.prefix, *self.tokens]

    def result(self, tokenizer) -> GenerationResult:
        return GenerationResult(
            request_id=self.request.request_id, sample_index=self.sample_index,
            prompt_ids=list(self.request.prompt_ids), response_ids=list(self.tokens),
            response_text=tokenizer.decode(self.response, skip_special_tokens=True), logprobs=list(self.logprobs),
            finish_reason=self.finish or "length",  # type: ignore[arg-type]
            versions=list(self.versions), offset=len(self.request.prefix))
