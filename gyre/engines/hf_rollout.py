"""Rollout engine on a local Hugging Face causal LM: continuous batching with per-request control.

Requests join the running batch between decoding steps (``add``), finished samples leave it and are
reported at once (``step``), and any request can be aborted with its tokens so far (``abort``). A
weight update goes ``suspend`` -> ``load_weights`` -> ``resume``: the KV cache is dropped, every row
keeps its tokens, and the next step re-prefills them under the new weights; each token records the
version that sampled it. Each distinct context is prefilled once and its cache repeated for the rows
that share it (a request's ``n`` samples).
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Mapping, Sequence

import torch

from gyre.engines import memory
from gyre.engines.base import SampleProgress, StepwiseGenerate
from gyre.engines.kv_batch import KVBatch, roomy_cache
from gyre.engines.sampling import StopChecker, position_noise, sample_tokens
from gyre.models.loading import eos_token_ids
from gyre.models.lora import AdapterMerger, AdapterWeights
from gyre.types import GenerationRequest, GenerationResult, SamplingParams, WeightVersion

# Compact the decoding batch once at least this fraction of its rows has finished.
_COMPACT_FRACTION = 0.25


class HFRolloutEngine(StepwiseGenerate):
    """Implements ``RolloutEngine`` over an in-process ``transformers`` model."""

    def __init__(self, model, tokenizer, device: str | torch.device = "cpu", max_batch_size: int | None = None,
                 max_batch_tokens: int | None = None, max_prefill_tokens: int | None = None,
                 autocast_dtype: torch.dtype | None = None, memory_share: float | None = None):
        self.model = model.eval()
        self._cache_key = cache_keyword(model)
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        """The KV cache's budget in tokens: rows join while rows x the longest row's final length (its context
        and what it may still sample: the cache is padded to the widest row) stays within it; a row alone
        always runs. None: no budget."""
        self.max_prefill_tokens = max_prefill_tokens
        """Tokens one prefill pass may hold (distinct contexts x the longest of them, padded): rows joining at
        once, and every row after a weight update, are prefilled in chunks of it. None: all at once."""
        self.autocast_dtype = autocast_dtype
        """Forward passes under autocast to this dtype: a hybrid policy rank samples in the compute dtype its
        trainer computes in, not with its float32 master weights. None: the model's own dtype."""
        self.memory_share = memory_share
        """On a GPU, the share of its memory this process may fill (rollout.gpu_memory_utilization): the KV
        budget becomes what is left of it once the weights are there (``memory.kv_token_budget``), or
        ``max_batch_tokens`` where smaller. Ignored on CPU."""
        self._share_budget: int | None = None
        """That budget in tokens, measured at the first admission after the weights reached the device."""
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self._version: WeightVersion = 0
        self._stop = StopChecker(tokenizer, self.eos_ids)
        self._waiting: deque[SampleProgress] = deque()
        """Rows admitted and not decoding: new ones, and those a ``suspend`` took out of the batch."""
        self._batch: KVBatch | None = None
        self._suspended = False
        self._merger: AdapterMerger | None = None
        """LoRA runs: the base weights the adapters are merged into (made at the first adapter)."""

    @property
    def weight_version(self) -> WeightVersion:
        return self._version

    # ---- weights and memory -------------------------------------------------------------
    def load_weights(self, weights: Mapping[str, torch.Tensor], version: WeightVersion) -> None:
        self._check_idle()
        params = self.model.state_dict(keep_vars=True)  # persistent tensors only, sharing storage with the model
        missing = [name for name in params if name not in weights and not _is_tied_alias(name, weights)]
        if missing:
            raise KeyError(f"weight update lacks {len(missing)} tensors, e.g. {missing[:3]}")
        with torch.no_grad():
            for name, tensor in weights.items():
                target = params.get(name)
                if target is not None and tensor.data_ptr() != target.data_ptr():  # not received in place
                    target.copy_(tensor.to(dtype=target.dtype, device=target.device))
        self._version = int(version)

    def weight_targets(self) -> dict[str, torch.Tensor]:
        """The tensors ``load_weights`` writes, by name: a weight channel may receive straight into them."""
        self._check_idle()
        return self.model.state_dict(keep_vars=True)

    def load_adapter(self, adapter: AdapterWeights, version: WeightVersion) -> None:
        """A LoRA policy's weight sync: every targeted weight becomes base + scale * B @ A, merged from the
        base weights this engine loaded (kept in host memory), and parameters trained in full are replaced."""
        self._check_idle()
        if self._merger is None:
            self._merger = AdapterMerger()
        self._merger.merge(self.model, adapter)
        self._version = int(version)

    def _check_idle(self) -> None:
        if self._batch is not None:
            raise RuntimeError(f"the engine is decoding {len(self._batch)} rows: suspend it before loading weights")

    def set_version(self, version: WeightVersion) -> None:
        """The model's weights were changed in place (a hybrid trainer stepped them): move the stamp only."""
        self._version = int(version)

    def offload(self) -> None:
        memory.offload(self.model, self.device)
        self._share_budget = None

    def reload(self, values: bool = True) -> None:
        """Undo ``offload``; ``values=False`` when a whole new version loads next (nothing old is copied)."""
        memory.reload(self.model, self.device, values=values or self._merger is not None)

    def kv_budget(self) -> int | None:
        """The KV-cache budget in tokens rows are admitted under: ``max_batch_tokens``, and on a GPU with a
        ``memory_share`` what that share leaves (None: no budget)."""
        if self.memory_share is None or self.device.type != "cuda":
            return self.max_batch_tokens
        if self._share_budget is None:
            dtype = self.autocast_dtype or next(self.model.parameters()).dtype
            self._share_budget = memory.kv_token_budget(self.model, self.device, self.memory_share, dtype)
        return min(self._share_budget, self.max_batch_tokens or self._share_budget)

    # ---- per-request control ----------------------------------------------------------------
    def add(self, requests: Sequence[GenerationRequest]) -> None:
        """Queue requests; their rows join the running batch at the next ``step`` with room for them."""
        for r in requests:
            self._waiting.extend(SampleProgress(r, r.first_sample + i) for i in range(r.n))

    def abort(self, request_ids: Sequence[str]) -> list[GenerationResult]:
        """Remove the rows of these requests wherever they are; returns each unfinished row's tokens so far
        (finish_reason "abort"), so it can be continued as a request with that prefix."""
        ids = set(request_ids)
        gone = [row for row in self._waiting if row.request.request_id in ids]
        self._waiting = deque(row for row in self._waiting if row.request.request_id not in ids)
        if self._batch is not None:
            gone += [row for row in self._batch.rows if row.request.request_id in ids and row.finish is None]
            self._batch.select([j for j, row in enumerate(self._batch.rows) if row.request.request_id not in ids])
            self._drop_if_empty()
        for row in gone:
            row.finish = "abort"
        return [row.result(self.tokenizer) for row in gone]

    def suspend(self) -> None:
        """Stop decoding and drop the KV cache (e.g. for a weight update); rows keep their tokens and
        are re-prefilled, ahead of newer requests, after ``resume``."""
        if self._batch is not None:
            live = [row for row in self._batch.rows if row.finish is None]
            self._waiting.extendleft(reversed(live))
            self._batch = None
        self._suspended = True

    def resume(self) -> None:
        self._suspended = False

    def request_ids(self) -> list[str]:
        """Requests with a sample waiting or decoding."""
        rows = [*self._waiting, *(r for r in (self._batch.rows if self._batch else []) if r.finish is None)]
        return list(dict.fromkeys(row.request.request_id for row in rows))

    @property
    def busy(self) -> bool:
        """Some row is waiting or decoding."""
        return bool(self._waiting) or self._batch is not None

    def step(self) -> list[GenerationResult]:
        """Admit waiting rows, sample one token for every decoding row, then run the next forward pass;
        returns the samples that finished."""
        if self._suspended:
            return []
        done = self._admit()
        if self._batch is None:
            return done
        batch = self._batch
        live = [j for j, row in enumerate(batch.rows) if row.finish is None]
        tokens = torch.full((len(batch),), self.pad_id, dtype=torch.long, device=self.device)
        for params, members in _by_params(batch.rows, live).items():
            index = torch.tensor(members, dtype=torch.long, device=self.device)
            keys = [(batch.rows[j].request.seed, batch.rows[j].sample_index, len(batch.rows[j].response))
                    for j in members]
            noise = position_noise(keys, batch.logits.shape[-1], self.device) if params.temperature > 0 else None
            picked, logps = sample_tokens(batch.logits[index], params, noise)
            tokens[index] = picked
            for j, tok, lp in zip(members, picked.tolist(), logps.tolist()):
                row = batch.rows[j]
                row.tokens.append(tok)
                row.logprobs.append(lp)
                row.versions.append(self._version)
                row.finish = self._stop(row.response, params.stop, params.ignore_eos) or (
                    "length" if len(row.response) >= params.max_new_tokens else None)
                if row.finish is not None:
                    done.append(row.result(self.tokenizer))
        self._decode(tokens)
        return done

    # ---- internals ------------------------------------------------------------------------------
    def _admit(self) -> list[GenerationResult]:
        """Prefill waiting rows while the batch has room (rows, and the KV budget); returns rows that had
        nothing left to sample."""
        live = [row for row in self._batch.rows if row.finish is None] if self._batch else []
        room = (self.max_batch_size or 1 << 30) - len(live)
        width = max(map(_final_length, live), default=0)
        budget = self.kv_budget() if self._waiting else None
        joining, done = [], []
        while self._waiting and len(joining) < room:
            row = self._waiting[0]
            if len(row.response) >= row.request.params.max_new_tokens:  # a continuation with no budget left
                self._waiting.popleft()
                row.finish = "length"
                done.append(row.result(self.tokenizer))
                continue
            wider = max(width, _final_length(row))
            rows = len(live) + len(joining)
            if budget is not None and rows and (rows + 1) * wider > budget:
                break  # waits for rows to finish
            joining.append(self._waiting.popleft())
            width = wider
        if joining:
            self._compact(force=True)
            for chunk in self._prefill_chunks(joining):
                fresh = self._prefill(chunk)
                if self._batch is None:
                    self._batch = fresh
                else:
                    self._batch.merge(fresh)
        return done

    def _prefill_chunks(self, rows: list[SampleProgress]) -> list[list[SampleProgress]]:
        """``rows`` cut where a prefill pass would pass ``max_prefill_tokens`` (distinct contexts x the longest;
        rows sharing a context stay together while they come together)."""
        if self.max_prefill_tokens is None:
            return [rows]
        chunks: list[list[SampleProgress]] = [[]]
        contexts: set[tuple[int, ...]] = set()
        widest = 0
        for row in rows:
            context = tuple(row.context)
            if context not in contexts:
                wider = max(widest, len(context))
                if contexts and (len(contexts) + 1) * wider > self.max_prefill_tokens:
                    chunks.append([])
                    contexts, wider = set(), len(context)
                contexts.add(context)
                widest = wider
            chunks[-1].append(row)
        return chunks

    @torch.inference_mode()
    def _prefill(self, rows: list[SampleProgress]) -> KVBatch:
        """Run each distinct context once, then give each row sharing it its own copy of the cache."""
        contexts: dict[tuple[int, ...], int] = {}
        owner = [contexts.setdefault(tuple(row.context), len(contexts)) for row in rows]
        input_ids, attention = self._left_pad([list(c) for c in contexts])
        positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
        # Without padding the mask is all ones: leave it out so attention takes the plain causal path.
        padded = bool((attention == 0).any())
        with self._autocast():
            out = self.model(input_ids=input_ids, attention_mask=attention if padded else None,
                             position_ids=positions, use_cache=True, logits_to_keep=1,
                             **{self._cache_key: roomy_cache(self.model.config)})
        expand = torch.tensor(owner, device=self.device)
        cache = out[self._cache_key]
        cache.batch_select_indices(expand)
        return KVBatch(rows, cache, attention[expand], positions[expand, -1] + 1, out.logits[expand, -1, :].float())

    @torch.inference_mode()
    def _decode(self, tokens: torch.Tensor) -> None:
        """One forward step for the batch's rows (finished ones are compacted away first when many)."""
        batch = self._batch
        keep = self._compact()
        if keep is not None:
            tokens = tokens[torch.tensor(keep, dtype=torch.long, device=self.device)]
        if self._drop_if_empty():
            return
        if batch.needs_room():  # rows joined or left since the room was made: room for the longest still to go
            batch.reserve(max(1, *(row.request.params.max_new_tokens - len(row.response)
                                   for row in batch.rows if row.finish is None)))
        batch.attention = torch.cat([batch.attention, batch.attention.new_ones(len(batch), 1)], dim=1)
        mask = None if bool(batch.attention.all()) else batch.attention
        with self._autocast():
            out = self.model(input_ids=tokens[:, None], attention_mask=mask, position_ids=batch.next_pos[:, None],
                             use_cache=True, **{self._cache_key: batch.cache})
        batch.next_pos = batch.next_pos + 1
        batch.logits = out.logits[:, -1, :].float()

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _compact(self, force: bool = False) -> list[int] | None:
        """Drop finished rows from the batch once they are a quarter of it (always with ``force``)."""
        batch = self._batch
        if batch is None:
            return None
        keep = [j for j, row in enumerate(batch.rows) if row.finish is None]
        if len(keep) == len(batch) or (not force and keep and len(keep) > (1 - _COMPACT_FRACTION) * len(batch)):
            return None
        batch.select(keep)
        return keep

    def _drop_if_empty(self) -> bool:
        if self._batch is not None and not any(row.finish is None for row in self._batch.rows):
            self._batch = None
        return self._batch is None

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            if p:
                ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
                mask[i, width - len(p):] = 1
        return ids.to(self.device), mask.to(self.device)

def _by_params(rows: list[SampleProgress], members: list[int]) -> dict[SamplingParams, list[int]]:
    groups: dict[SamplingParams, list[int]] = {}
    for j in members:
        groups.setdefault(rows[j].request.params, []).append(j)
    return groups

def _is_tied_alias(name: str, weights: Mapping[str, torch.Tensor]) -> bool:
    """lm_head.weight may be absent when tied to the input embedding (and vice versa)."""
    return name.endswith("lm_head.weight") and any(k.endswith("embed_tokens.weight") for k in weights)


def _final_length(row: SampleProgress) -> int:
    """Tokens the row's cache holds once it has sampled all it may: its context and what it may still sample."""
    return len(row.context) + row.request.params.max_new_tokens - len(row.response)


def cache_keyword(model) -> str:
    """The name a model's forward takes its KV cache by (and its output returns it under): ``cache`` in
    transformers releases that renamed it, ``past_key_values`` before them (the old name warns from 5.2x
    and goes in 5.40). A peft wrapper is looked through to the model it wraps."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
