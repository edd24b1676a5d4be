"""Collate groups of trajectories (or SFT rows) into padded trainer tensors; split batches over DP ranks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gyre.types import Group, TrainBatch, select_rows


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


@dataclass(frozen=True)
class GroupLayout:
    """Which batch rows belong to which group: group statistics go through this, never through row positions."""

    rows: tuple[tuple[int, ...], ...]
    """The batch rows of each group, in group order."""

    @classmethod
    def of(cls, groups: Sequence[Group]) -> GroupLayout:
        """The layout ``collate_groups`` writes: groups in order, each group's trajectories in order."""
        rows, start = [], 0
        for g in groups:
            rows.append(tuple(range(start, start + len(g.trajectories))))
            start += len(g.trajectories)
        return cls(tuple(rows))

    def group_index(self) -> torch.Tensor:
        """[B] int64: the group of each batch row."""
        return torch.tensor([g for g, rows in enumerate(self.rows) for _ in rows], dtype=torch.long)

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        """[B] per-row values -> [G, n], one row per group. Groups must be of equal size."""
        sizes = {len(r) for r in self.rows}
        if len(sizes) > 1:
            raise ValueError(f"groups of unequal sizes {sorted(sizes)}: per-group statistics need equal groups")
        return values[torch.tensor(self.rows, dtype=torch.long)]

    def scatter(self, grouped: torch.Tensor) -> torch.Tensor:
        """Inverse of ``gather``: [G, n] -> [B] in batch row order."""
        out = grouped.new_empty(sum(len(r) for r in self.rows))
        out[torch.tensor(self.rows, dtype=torch.long)] = grouped
        return out


@dataclass(frozen=True)
class TurnLayout:
    """Where the model turns of each batch row lie, and what the environment said of them: turn-level
    advantages are computed per turn and spread over each turn's tokens through this."""

    spans: tuple[tuple[tuple[int, int], ...], ...]
    """Per batch row, the token positions [start, end) of each model turn in the row (prompt + response)."""
    rewards: tuple[tuple[float, ...], ...]
    """Per batch row, the environment's reward for each turn."""
    states: tuple[tuple[str, ...], ...]
    """Per batch row, the key of the state each turn acted on ("" when unknown)."""

    @classmethod
    def of(cls, groups: Sequence[Group]) -> TurnLayout:
        """The layout ``collate_groups`` writes: a turn's offsets among the response tokens, shifted by the
        prompt. A single-turn trajectory has no turns (an empty row)."""
        spans, rewards, states = [], [], []
        for t in (t for g in groups for t in g.trajectories):
            prompt, end = len(t.prompt.prompt_ids), 0
            for turn in t.turns:
                if not end <= turn.start <= turn.end <= len(t.response_ids):
                    raise ValueError(f"trajectory {t.prompt.uid}#{t.sample_index}: turn [{turn.start}, {turn.end}) "
                                     f"overlaps the turn before it or runs past its {len(t.response_ids)} "
                                     "response tokens")
                end = turn.end
            spans.append(tuple((prompt + turn.start, prompt + turn.end) for turn in t.turns))
            rewards.append(tuple(turn.reward for turn in t.turns))
            states.append(tuple(turn.state for turn in t.turns))
        return cls(tuple(spans), tuple(rewards), tuple(states))

    def padded(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(rewards [B, K] float32, mask [B, K] float32, state ids [B, K] int64), K the most turns of a row.

        Equal state keys get equal ids; an unknown state ("") gets an id of its own (it anchors nothing)."""
        b, k = len(self.spans), max((len(s) for s in self.spans), default=0)
        rewards = torch.zeros((b, k), dtype=torch.float32)
        mask = torch.zeros((b, k), dtype=torch.float32)
        states = torch.full((b, k), -1, dtype=torch.long)
        ids: dict[str, int] = {}
        for i, (row_rewards, row_states) in enumerate(zip(self.rewards, self.states)):
            n = len(row_rewards)
            rewards[i, :n] = torch.tensor(row_rewards, dtype=torch.float32)
            mask[i, :n] = 1.0
            for j, key in enumerate(row_states):
                # Known keys number at most b * k, so the ids from b * k on are free for unknown states.
                states[i, j] = ids.setdefault(key, len(ids)) if key else b * k + i * k + j
        return rewards, mask, states

    def broadcast(self, per_turn: torch.Tensor, width: int) -> torch.Tensor:
        """[B, K] per-turn values -> [B, width]: each turn's value on its tokens, 0 elsewhere (prompt,
        observations, padding)."""
        index = torch.full((len(self.spans), width), -1, dtype=torch.long)
        for i, row in enumerate(self.spans):
            for j, (start, end) in enumerate(row):
                index[i, start:end] = j
        spread = per_turn.gather(1, index.clamp(min=0))
        return torch.where(index >= 0, spread, torch.zeros_like(spread))


def collate_groups(groups: Sequence[Group], pad_id: int) -> tuple[TrainBatch, GroupLayout]:
    """Right-padded [B, L] tensors of committed groups (one row per trajectory: prompt + its segments).

    ``response_mask`` is 1 on trainable segments only (it need not be contiguous: observation tokens
    between turns are 0), ``versions`` holds each sampled token's weight version, ``rollout_logprobs`` the
    sampler's log-probs. Advantages are 0 until the advantage stage fills them.
    """
    trajectories = [t for g in groups for t in g.trajectories]
    if not trajectories:
        raise ValueError("no trajectories to collate")
    lengths = [len(t.prompt.prompt_ids) + sum(len(s.token_ids) for s in t.segments) for t in trajectories]
    b, width = len(trajectories), max(lengths)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    attention = torch.zeros((b, width), dtype=torch.long)
    trainable = torch.zeros((b, width), dtype=torch.float32)
    logprobs = torch.zeros((b, width), dtype=torch.float32)
    versions = torch.full((b, width), -1, dtype=torch.long)
    for i, t in enumerate(trajectories):
        if not t.prompt.prompt_ids:
            raise ValueError("a prompt must have at least one token")
        pos = len(t.prompt.prompt_ids)
        ids[i, :pos] = torch.tensor(t.prompt.prompt_ids, dtype=torch.long)
        for seg in t.segments:
            end = pos + len(seg.token_ids)
            ids[i, pos:end] = torch.tensor(seg.token_ids, dtype=torch.long)
            logprobs[i, pos:end] = torch.tensor(seg.logprobs, dtype=torch.float32)
            if seg.trainable:
                trainable[i, pos:end] = 1.0
            if seg.weight_version is not None:
                versions[i, pos:end] = seg.weight_version
            pos = end
        attention[i, :pos] = 1
    batch = TrainBatch(input_ids=ids, attention_mask=attention, response_mask=trainable,
                       advantages=torch.zeros((b, width), dtype=torch.float32), rollout_logprobs=logprobs,
                       versions=versions)
    return batch, GroupLayout.of(groups)


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
