"""Rollout engine on a local Hugging Face causal LM: batched sampling with a KV cache.

Each distinct prompt is prefilled once and its KV cache is repeated for its ``n`` samples. Finished
rows are dropped from the batch (and the cache) as decoding goes on, so a long tail does not keep
paying for rows that are done.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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
    sample_index: int
    tokens: list[int]
    logprobs: list[float]
    finish: str | None = None


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
                  generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; returns (tokens [B], log-prob under the sampled distribution [B])."""
    logits = logits.float()
    if params.temperature == 0.0:
        tokens = logits.argmax(dim=-1)
        return tokens, torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
    logits = filter_logits(logits / params.temperature, params.top_k, params.top_p)
    logp = torch.log_softmax(logits, dim=-1)
    tokens = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


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

    def offload(self) -> None:
        memory.offload(self.model, self.device)

    def reload(self) -> None:
        memory.reload(self.model, self.device)

    # ---- generation ---------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        results: list[GenerationResult] = []
        for chunk in self._chunks(requests):
            results.extend(self._generate_chunk(chunk))
        order = {r.request_id: i for i, r in enumerate(requests)}
        results.sort(key=lambda res: (order[res.request_id], res.sample_index))
        return results

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
    def _generate_chunk(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        from transformers import DynamicCache

        params = requests[0].params
        generator = torch.Generator(device=self.device).manual_seed(_mix_seeds(r.seed for r in requests))
        input_ids, attention = self._left_pad([r.prompt_ids for r in requests])
        positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
        # Without padding the mask is all ones: leave it out so attention takes the plain causal path.
        padded = bool((attention == 0).any())
        cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=input_ids, attention_mask=attention if padded else None, position_ids=positions,
                         past_key_values=cache, use_cache=True)
        # Prefill once per prompt, then give each of its n samples its own copy of the cache.
        expand = torch.repeat_interleave(torch.arange(len(requests), device=self.device),
                                         torch.tensor([r.n for r in requests], device=self.device))
        cache = out.past_key_values
        cache.batch_select_indices(expand)
        logits = out.logits[expand, -1, :]
        attention = attention[expand]
        next_pos = positions[expand, -1] + 1
        rows = [_Row(r, i, [], []) for r in requests for i in range(r.n)]
        active = list(range(len(rows)))  # rows[active[j]] is batch row j
        stop_check = _StopChecker(self.tokenizer, params.stop, self.eos_ids)
        for step in range(params.max_new_tokens):
            tokens, logps = sample_tokens(logits, params, generator)
            for j, (tok, lp) in enumerate(zip(tokens.tolist(), logps.tolist())):
                row = rows[active[j]]
                row.tokens.append(tok)
                row.logprobs.append(lp)
                row.finish = stop_check(row.tokens) or ("length" if step + 1 == params.max_new_tokens else None)
            keep = [j for j, i in enumerate(active) if rows[i].finish is None]
            if not keep:
                break
            if len(keep) <= (1 - _COMPACT_FRACTION) * len(active):
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                tokens, attention, next_pos = tokens[index], attention[index], next_pos[index]
                active = [active[j] for j in keep]
            if padded:
                attention = torch.cat([attention, attention.new_ones(len(active), 1)], dim=1)
            out = self.model(input_ids=tokens[:, None], attention_mask=attention if padded else None,
                             position_ids=next_pos[:, None], past_key_values=cache, use_cache=True)
            logits = out.logits[:, -1, :]
            next_pos = next_pos + 1
        return [self._result(row) for row in rows]

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


def _mix_seeds(seeds) -> int:
    value = 0x9E3779B97F4A7C15
    for s in itertools.islice(seeds, 4096):
        value = (value * 6364136223846793005 + int(s) + 1442695040888963407) % (1 << 63)
    return value


def _is_tied_alias(name: str, weights: Mapping[str, torch.Tensor]) -> bool:
    """lm_head.weight may be absent when tied to the input embedding (and vice versa)."""
    return name.endswith("lm_head.weight") and any(k.endswith("embed_tokens.weight") for k in weights)
