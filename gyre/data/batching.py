"""Collate groups of trajectories (or SFT rows) into padded trainer tensors; split batches over DP ranks."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gyre.types import Group, TrainBatch, Trajectory, select_rows


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
    """What the environment said of each trajectory's model turns (turn-level advantages are computed per
    trajectory and turn, then spread over the rows that train the turns through ``RowMap``)."""

    rewards: tuple[tuple[float, ...], ...]
    """Per trajectory, the environment's reward for each turn."""
    states: tuple[tuple[str, ...], ...]
    """Per trajectory, the key of the state each turn acted on ("" when unknown)."""

    @classmethod
    def of(cls, groups: Sequence[Group]) -> TurnLayout:
        """Trajectories in batch order; a single-turn trajectory has no turns (an empty row)."""
        rewards, states = [], []
        for t in (t for g in groups for t in g.trajectories):
            _check_turns(t)
            rewards.append(tuple(turn.reward for turn in t.turns))
            states.append(tuple(turn.state for turn in t.turns))
        return cls(tuple(rewards), tuple(states))

    def padded(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(rewards [E, K] float32, mask [E, K] float32, state ids [E, K] int64), K the most turns of a trajectory.

        Equal state keys get equal ids; an unknown state ("") gets an id of its own (it anchors nothing)."""
        b, k = len(self.rewards), max((len(r) for r in self.rewards), default=0)
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


def _check_turns(t: Trajectory) -> None:
    end = 0
    for turn in t.turns:
        if not end <= turn.start <= turn.end <= len(t.response_ids):
            raise ValueError(f"trajectory {t.prompt.uid}#{t.sample_index}: turn [{turn.start}, {turn.end}) overlaps "
                             f"the turn before it or runs past its {len(t.response_ids)} response tokens")
        end = turn.end


@dataclass(frozen=True)
class RowMap:
    """Which trajectory each batch row trains, and where that trajectory's model turns lie in the row.

    A trajectory is one row, or (step-level samples, ``Trajectory.window``) one row per model turn; rows
    past the trajectories are padding (so that data-parallel ranks get equal shares), they train nothing.
    Per-trajectory values (rewards, baselines) reach rows through ``expand``, per-turn ones through
    ``broadcast``."""

    trajectory: tuple[int, ...]
    """Per row, its trajectory's index in batch order (-1: a padding row)."""
    turns: tuple[tuple[tuple[int, int, int], ...], ...]
    """Per row, (turn index, start, end): the token positions of each model turn the row trains."""

    @classmethod
    def of(cls, groups: Sequence[Group], rows: int | None = None) -> RowMap:
        """The rows ``collate_groups`` writes (``rows``: the batch's row count, padding included)."""
        owner, turns = [], []
        for e, t in enumerate(t for g in groups for t in g.trajectories):
            prompt = len(t.prompt.prompt_ids)
            for context, trained, end in t.rows():
                owner.append(e)
                # Turns wholly inside [trained, end), at their positions in a row that starts at ``context``.
                turns.append(tuple((k, prompt + turn.start - context, prompt + turn.end - context)
                                   for k, turn in enumerate(t.turns) if trained <= turn.start and turn.end <= end))
        pad = (rows or len(owner)) - len(owner)
        if pad < 0:
            raise ValueError(f"the groups make {len(owner)} rows, more than the batch's {rows}")
        return cls(tuple(owner + [-1] * pad), tuple(turns + [()] * pad))

    def expand(self, values: torch.Tensor) -> torch.Tensor:
        """[E] per-trajectory values -> [B] per row (0 on padding rows)."""
        index = torch.tensor(self.trajectory, dtype=torch.long)
        return torch.where(index >= 0, values[index.clamp(min=0)], torch.zeros((), dtype=values.dtype))

    def broadcast(self, per_turn: torch.Tensor, width: int) -> torch.Tensor:
        """[E, K] per-turn values -> [B, width]: each turn's value on its tokens in the rows that train it, 0
        elsewhere (prompt, observations, earlier turns shown as context, padding)."""
        index = torch.full((len(self.trajectory), width), -1, dtype=torch.long)
        k = max(per_turn.shape[1], 1)
        for i, (e, row) in enumerate(zip(self.trajectory, self.turns)):
            for j, start, end in row:
                index[i, start:end] = e * k + j
        flat = per_turn.reshape(-1)
        spread = flat[index.clamp(min=0)] if flat.numel() else torch.zeros(index.shape, dtype=per_turn.dtype)
        return torch.where(index >= 0, spread, torch.zeros_like(spread))


def collate_groups(groups: Sequence[Group], pad_id: int, multiple: int = 1) -> tuple[TrainBatch, GroupLayout]:
    """Right-padded [B, L] tensors of committed groups: one row per trajectory (prompt + its segments), or
    per model turn for step-level samples (``Trajectory.rows``), then padding rows up to a multiple of
    ``multiple`` (one pad token, nothing trained: step-level batches vary in size, data-parallel ranks
    need equal shares).

    ``response_mask`` is 1 on the trainable tokens a row trains (it need not be contiguous: observation
    tokens between turns are 0), ``versions`` holds each sampled token's weight version, ``rollout_logprobs``
    the sampler's log-probs. Advantages are 0 until the advantage stage fills them.
    """
    trajectories = [t for g in groups for t in g.trajectories]
    if not trajectories:
        raise ValueError("no trajectories to collate")
    rows = [(t, *span) for t in trajectories for span in t.rows()]
    b = -(-len(rows) // multiple) * multiple
    width = max(len(t.prompt.prompt_ids) + end - context for t, context, _, end in rows)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    attention = torch.zeros((b, width), dtype=torch.long)
    attention[len(rows):, 0] = 1  # padding rows: one token, so that every row has something to attend to
    trainable = torch.zeros((b, width), dtype=torch.float32)
    logprobs = torch.zeros((b, width), dtype=torch.float32)
    versions = torch.full((b, width), -1, dtype=torch.long)
    for i, (t, context, trained, end) in enumerate(rows):
        if not t.prompt.prompt_ids:
            raise ValueError("a prompt must have at least one token")
        pos = len(t.prompt.prompt_ids)
        ids[i, :pos] = torch.tensor(t.prompt.prompt_ids, dtype=torch.long)
        seg_start = 0  # the segment's offset among the response tokens
        for seg in t.segments:
            seg_end = seg_start + len(seg.token_ids)
            lo, hi = max(seg_start, context), min(seg_end, end)  # the part of it in this row
            if lo < hi:
                at, part = slice(pos + lo - context, pos + hi - context), slice(lo - seg_start, hi - seg_start)
                ids[i, at] = torch.tensor(seg.token_ids[part], dtype=torch.long)
                logprobs[i, at] = torch.tensor(seg.logprobs[part], dtype=torch.float32)
                if seg.trainable and hi > trained:
                    trainable[i, pos + max(lo, trained) - context:at.stop] = 1.0
                if seg.weight_version is not None:
                    versions[i, at] = seg.weight_version
            seg_start = seg_end
        attention[i, :pos + end - context] = 1
    batch = TrainBatch(input_ids=ids, attention_mask=attention, response_mask=trainable,
                       advantages=torch.zeros((b, width), dtype=torch.float32), rollout_logprobs=logprobs,
                       versions=versions)
    return batch, GroupLayout.of(groups)


def balanced_shards(batch: TrainBatch, parts: int, equal: bool = True) -> list[torch.Tensor]:
    """Row indices for ``parts`` workers, token loads balanced greedily (largest rows first).

    ``equal`` gives every part the same row count, which data-parallel trainer ranks need (their
    collectives must match step for step); forward-only workers take counts that differ by at most 1.
    """
    rows = balanced_rows(batch.attention_mask.sum(dim=1).tolist(), parts, equal)
    return [torch.tensor(m, dtype=torch.long) for m in rows]


def balanced_rows(tokens: Sequence[int], parts: int, equal: bool = True) -> list[list[int]]:
    """``balanced_shards`` on rows of ``tokens`` tokens (what the simulator splits its rows by): each row,
    longest first, goes to the least loaded part with room (the lowest index on a tie); each part's rows
    in batch order."""
    n = len(tokens)
    if equal and n % parts:
        raise ValueError(f"{n} rows cannot be split evenly over {parts} ranks")
    cap = [n // parts + (0 if equal or r >= n % parts else 1) for r in range(parts)]
    members: list[list[int]] = [[] for _ in range(parts)]
    heap = [(0, r) for r in range(parts) if cap[r]]  # (load, part): the least loaded, then the lowest index
    for row in sorted(range(n), key=lambda i: -tokens[i]):
        load, rank = heapq.heappop(heap)
        members[rank].append(row)
        if len(members[rank]) < cap[rank]:
            heapq.heappush(heap, (load + tokens[row], rank))
    return [sorted(m) for m in members]


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
