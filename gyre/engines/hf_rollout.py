"""Rollout engine on a local Hugging Face causal LM: batched sampling with a KV cache.

Each distinct prompt is prefilled once and its KV cache is repeated for its ``n`` samples. Finished
rows are dropped from the batch (and the cache) as decoding goes on, so a long tail does not keep
paying for rows that are done.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from gyre.engines import memory
from gyre.models.loading import eos_token_ids
from gyre.types import GenerationRequest, GenerationResult, SamplingParams, WeightVersion

# Compact the decoding batch once at least this fraction of its rows has finished.
_COMPACT_FRACTION = 0.25


@dataclass
class _Row:
    """Book-keeping for one sample while it is decoded."""

    request: GenerationRequest
    request_index: int
    sample_index: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None


@dataclass
class _Batch:
    """The decoding batch: batch row j is ``rows[active[j]]``; tensors are [len(active), ...]."""

    rows: list[_Row]
    active: list[int]
    cache: object
    attention: torch.Tensor | None
    """[len(active), L] padding mask, or None when no prompt of the chunk is padded."""
    next_pos: torch.Tensor

    def select(self, keep: list[int], tokens: torch.Tensor) -> torch.Tensor:
        """Drop finished rows from the batch and the KV cache; returns the kept rows' tokens."""
        index = torch.tensor(keep, device=tokens.device)
        self.cache.batch_select_indices(index)
        self.next_pos = self.next_pos[index]
        if self.attention is not None:
            self.attention = self.attention[index]
        self.active = [self.active[j] for j in keep]
        return tokens[index]


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k / top-p (nucleus) set to -inf. logits: [B, V] float32."""
    if top_k and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the mass strictly before it already reaches top_p (the top token always stays).
        drop_sorted = (probs.cumsum(dim=-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_tokens(logits: torch.Tensor, params: SamplingParams,
                  noise: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; returns (tokens [B], log-prob under the sampled distribution [B]).

    Sampling uses the exponential race: argmax_v p_v / E_v with E_v ~ Exp(1) draws v with probability
    p_v. ``noise`` [B, V] holds the E values, drawn from each request's own generator, so a row's
    sample does not depend on which other rows share its batch. Greedy decoding needs no noise.
    """
    logits = logits.float()
    if params.temperature == 0.0:
        tokens = logits.argmax(dim=-1)
        return tokens, torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
    logits = filter_logits(logits / params.temperature, params.top_k, params.top_p)
    logp = torch.log_softmax(logits, dim=-1)
    tokens = (logp - noise.clamp_min(1e-30).log()).argmax(dim=-1)  # a float32 draw of exactly 0 stays finite
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


class _RowNoise:
    """Exponential noise for every decoding row, one generator per request.

    Each step draws a [n, V] block per request that still has an unfinished row, whatever rows are
    active, so sample i of a request always sees the same noise sequence: the same request, seed and
    weights give the same samples however requests are split over workers and batches (up to the
    floating-point effects of batching on the logits).
    """

    def __init__(self, requests: list[GenerationRequest], device: torch.device, vocab: int):
        self.requests = requests
        self.vocab = vocab
        self.generators = [torch.Generator(device=device).manual_seed(r.seed) for r in requests]
        self.device = device

    def draw(self, rows: list[_Row]) -> torch.Tensor:
        """Noise [len(rows), V] for the active rows (row.request_index, row.sample_index)."""
        out = torch.empty((len(rows), self.vocab), device=self.device)
        wanted: dict[int, list[tuple[int, int]]] = {}
        for j, row in enumerate(rows):
            wanted.setdefault(row.request_index, []).append((j, row.sample_index))
        for r, pairs in wanted.items():
            block = torch.empty((self.requests[r].n, self.vocab), device=self.device)
            block.exponential_(generator=self.generators[r])
            out[[j for j, _ in pairs]] = block[[i for _, i in pairs]]
        return out


class HFRolloutEngine:
    """Implements ``RolloutEngine`` over an in-process ``transformers`` model."""

    def __init__(self, model, tokenizer, device: str | torch.device = "cpu", max_batch_size: int | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.max_batch_size = max_batch_size
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self._version: WeightVersion = 0

    @property
    def weight_version(self) -> WeightVersion:
        return self._version

    # ---- weights and memory -------------------------------------------------------------
    def load_weights(self, weights: Mapping[str, torch.Tensor], version: WeightVersion) -> None:
        params = self.model.state_dict(keep_vars=True)  # persistent tensors only, sharing storage with the model
        missing = [name for name in params if name not in weights and not _is_tied_alias(name, weights)]
        if missing:
            raise KeyError(f"weight update lacks {len(missing)} tensors, e.g. {missing[:3]}")
        with torch.no_grad():
            for name, tensor in weights.items():
                target = params.get(name)
                if target is not None:
                    target.copy_(tensor.to(dtype=target.dtype, device=target.device))
        self._version = int(version)

    def set_version(self, version: WeightVersion) -> None:
        """The model's weights were changed in place (a hybrid trainer stepped them): move the stamp only."""
        self._version = int(version)

    def offload(self) -> None:
        memory.offload(self.model, self.device)

    def reload(self) -> None:
        memory.reload(self.model, self.device)

    # ---- generation ---------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        results = [res for part in self.generate_stream(requests, parts=1) for res in part]
        order = {r.request_id: i for i, r in enumerate(requests)}
        results.sort(key=lambda res: (order[res.request_id], res.sample_index))
        return results

    def generate_stream(self, requests: Sequence[GenerationRequest],
                        parts: int = 8) -> Iterator[list[GenerationResult]]:
        """The same samples as ``generate``, handed out as they finish in up to ``parts`` parts per chunk,
        so rewards can start on early finishers while the rest still decode (1: one part per chunk)."""
        for chunk in self._chunks(requests):
            yield from self._generate_chunk(chunk, parts)

    def _chunks(self, requests: Sequence[GenerationRequest]):
        """Requests with equal sampling params, at most ``max_batch_size`` sequences per chunk."""
        by_params: dict[SamplingParams, list[GenerationRequest]] = {}
        for req in requests:
            by_params.setdefault(req.params, []).append(req)
        limit = self.max_batch_size or 1 << 30
        for group in by_params.values():
            chunk: list[GenerationRequest] = []
            size = 0
            for req in group:
                if chunk and size + req.n > limit:
                    yield chunk
                    chunk, size = [], 0
                chunk.append(req)
                size += req.n
            if chunk:
                yield chunk

    @torch.inference_mode()
    def _generate_chunk(self, requests: list[GenerationRequest], parts: int) -> Iterator[list[GenerationResult]]:
        params = requests[0].params
        batch, logits = self._prefill(requests)
        noise = _RowNoise(requests, self.device, logits.shape[-1]) if params.temperature > 0 else None
        stop_check = _StopChecker(self.tokenizer, params.stop, self.eos_ids)
        emit_every = max(1, len(batch.rows) // parts)
        done: list[_Row] = []
        for step in range(params.max_new_tokens):
            active_rows = [batch.rows[i] for i in batch.active]
            tokens, logps = sample_tokens(logits, params, noise.draw(active_rows) if noise else None)
            last = step + 1 == params.max_new_tokens
            for row, tok, lp in zip(active_rows, tokens.tolist(), logps.tolist()):
                if row.finish is not None:  # finished, still in the batch until the next compaction
                    continue
                row.tokens.append(tok)
                row.logprobs.append(lp)
                row.finish = stop_check(row.tokens) or ("length" if last else None)
                if row.finish is not None:
                    done.append(row)
            if len(done) >= emit_every:
                yield [self._result(row) for row in done]
                done = []
            keep = [j for j, row in enumerate(active_rows) if row.finish is None]
            if not keep:
                break
            if len(keep) <= (1 - _COMPACT_FRACTION) * len(active_rows):
                tokens = batch.select(keep, tokens)
            logits = self._decode(batch, tokens)
        if done:
            yield [self._result(row) for row in done]

    def _prefill(self, requests: list[GenerationRequest]) -> tuple[_Batch, torch.Tensor]:
        """Run each distinct prompt once, then give each of its n samples its own copy of the cache."""
        from transformers import DynamicCache

        input_ids, attention = self._left_pad([r.prompt_ids for r in requests])
        positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
        # Without padding the mask is all ones: leave it out so attention takes the plain causal path.
        padded = bool((attention == 0).any())
        out = self.model(input_ids=input_ids, attention_mask=attention if padded else None, position_ids=positions,
                         past_key_values=DynamicCache(config=self.model.config), use_cache=True, logits_to_keep=1)
        counts = torch.tensor([r.n for r in requests], device=self.device)
        expand = torch.repeat_interleave(torch.arange(len(requests), device=self.device), counts)
        cache = out.past_key_values
        cache.batch_select_indices(expand)
        rows = [_Row(r, k, i) for k, r in enumerate(requests) for i in range(r.n)]
        batch = _Batch(rows, list(range(len(rows))), cache, attention[expand] if padded else None,
                       positions[expand, -1] + 1)
        return batch, out.logits[expand, -1, :]

    def _decode(self, batch: _Batch, tokens: torch.Tensor) -> torch.Tensor:
        """One decoding step for the active rows; returns next-token logits [len(active), V]."""
        if batch.attention is not None:
            batch.attention = torch.cat([batch.attention, batch.attention.new_ones(len(batch.active), 1)], dim=1)
        out = self.model(input_ids=tokens[:, None], attention_mask=batch.attention,
                         position_ids=batch.next_pos[:, None], past_key_values=batch.cache, use_cache=True)
        batch.next_pos = batch.next_pos + 1
        return out.logits[:, -1, :]

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            if p:
                ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
                mask[i, width - len(p):] = 1
        return ids.to(self.device), mask.to(self.device)

    def _result(self, row: _Row) -> GenerationResult:
        return GenerationResult(
            request_id=row.request.request_id, sample_index=row.sample_index, prompt_ids=list(row.request.prompt_ids),
            response_ids=row.tokens, response_text=self.tokenizer.decode(row.tokens, skip_special_tokens=True),
            logprobs=row.logprobs, finish_reason=row.finish or "length",  # type: ignore[arg-type]
            weight_version=self._version)


class _StopChecker:
    """Decides whether a row just finished: EOS token, or a stop string completed by the last token."""

    def __init__(self, tokenizer, stop: tuple[str, ...], eos_ids: list[int]):
        self.tokenizer = tokenizer
        self.stop = stop
        self.eos = set(eos_ids)
        # A stop string of k characters spans at most k tokens (every token decodes to >= 1 character),
        # so decoding that many trailing tokens (+1 for a token that straddles the boundary) suffices.
        self.window = max((len(s) for s in stop), default=0) + 1

    def __call__(self, tokens: list[int]) -> str | None:
        if tokens[-1] in self.eos:
            return "eos"
        if self.stop:
            tail = self.tokenizer.decode(tokens[-self.window:], skip_special_tokens=True)
            if any(s in tail for s in self.stop):
                return "stop"
        return None


def _is_tied_alias(name: str, weights: Mapping[str, torch.Tensor]) -> bool:
    """lm_head.weight may be absent when tied to the input embedding (and vice versa)."""
    return name.endswith("lm_head.weight") and any(k.endswith("embed_tokens.weight") for k in weights)
