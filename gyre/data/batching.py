"""Collate samples into padded trainer tensors, and split batches across data-parallel ranks."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gyre.types import Sample, TrainBatch, select_rows


def collate(prompts: Sequence[list[int]], responses: Sequence[list[int]], pad_id: int,
            advantages: Sequence[float] | None = None,
            rollout_logprobs: Sequence[list[float]] | None = None) -> TrainBatch:
    """Right-padded [B, L] tensors of prompt + response; per-token fields aligned with input_ids."""
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    b, width = len(lengths), max(lengths)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    attention = torch.zeros((b, width), dtype=torch.long)
    resp_mask = torch.zeros((b, width), dtype=torch.float32)
    adv = torch.zeros((b, width), dtype=torch.float32)
    lps = torch.zeros((b, width), dtype=torch.float32)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        if not p:
            raise ValueError("a prompt must have at least one token")
        n, m = len(p), len(r)
        ids[i, :n + m] = torch.tensor(p + r, dtype=torch.long)
        attention[i, :n + m] = 1
        resp_mask[i, n:n + m] = 1.0
        if advantages is not None:
            adv[i, n:n + m] = float(advantages[i])
        if rollout_logprobs is not None:
            lps[i, n:n + m] = torch.tensor(rollout_logprobs[i], dtype=torch.float32)
    return TrainBatch(input_ids=ids, attention_mask=attention, response_mask=resp_mask, advantages=adv,
                      rollout_logprobs=lps)


def samples_to_batch(samples: Sequence[Sample], pad_id: int) -> TrainBatch:
    """The trainer tensors of scored samples; advantages are 0 until the advantage stage fills them."""
    return collate([s.result.prompt_ids for s in samples], [s.result.response_ids for s in samples], pad_id,
                   rollout_logprobs=[s.result.logprobs for s in samples])


def balanced_shards(batch: TrainBatch, parts: int, equal: bool = True) -> list[torch.Tensor]:
    """Row indices for ``parts`` workers, token loads balanced greedily (largest rows first).

    ``equal`` gives every part the same row count, which data-parallel trainer ranks need (their
    collectives must match step for step); forward-only workers take counts that differ by at most 1.
    """
    n = len(batch)
    if equal and n % parts:
        raise ValueError(f"{n} rows cannot be split evenly over {parts} ranks")
    cap = [n // parts + (0 if equal or r >= n % parts else 1) for r in range(parts)]
    tokens = batch.attention_mask.sum(dim=1).tolist()
    loads = [0] * parts
    members: list[list[int]] = [[] for _ in range(parts)]
    for row in sorted(range(n), key=lambda i: -tokens[i]):
        rank = min((r for r in range(parts) if len(members[r]) < cap[r]), key=lambda r: loads[r])
        members[rank].append(row)
        loads[rank] += tokens[row]
    return [torch.tensor(sorted(m), dtype=torch.long) for m in members]


def split_for_ranks(batch: TrainBatch, parts: int, equal: bool = True) -> tuple[list[TrainBatch], list[torch.Tensor]]:
    """Balanced per-worker shards and the row indices each one took (to put results back in order)."""
    index = balanced_shards(batch, parts, equal)
    return [select_rows(batch, ix) for ix in index], index


def gather_rows(parts: Sequence[torch.Tensor], index: Sequence[torch.Tensor], total: int) -> torch.Tensor:
    """Inverse of ``split_for_ranks`` for a per-row tensor result ([rows, ...] per part)."""
    width = max(p.shape[1] for p in parts)
    out = torch.zeros((total, width), dtype=parts[0].dtype)
    for part, ix in zip(parts, index):
        out[ix, :part.shape[1]] = part
    return out
