"""The running batch of a continuously batching HF engine: rows, their KV cache, masks and positions.

Rows join (``merge``) and leave (``select``) between decoding steps. Caches of rows prefilled at
different times have different lengths; they are aligned by left-padding keys and values with zeros
under a zero attention mask, and columns that are padding in every row are trimmed away (``trim``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class KVBatch:
    """Batch row j is ``rows[j]``; every tensor's first dimension is len(rows)."""

    rows: list
    cache: object
    """A transformers ``DynamicCache`` of full-attention layers, [B, heads, T, dim] per layer."""
    attention: torch.Tensor
    """[B, T] 1 on real cache positions, 0 on left padding."""
    next_pos: torch.Tensor
    """[B] position id of each row's next token."""
    logits: torch.Tensor
    """[B, V] next-token logits of each row."""

    def select(self, keep: list[int]) -> None:
        """Keep rows ``keep`` (in that order) and drop the others from every tensor and the cache."""
        index = torch.tensor(keep, dtype=torch.long, device=self.attention.device)
        self.cache.batch_select_indices(index)
        self.rows = [self.rows[j] for j in keep]
        self.attention, self.next_pos, self.logits = self.attention[index], self.next_pos[index], self.logits[index]
        self.trim()

    def trim(self) -> None:
        """Drop leading cache columns that are padding in every row."""
        used = self.attention.any(dim=0).nonzero()
        first = int(used[0]) if len(used) else self.attention.shape[1]
        if first == 0:
            return
        self.attention = self.attention[:, first:]
        for layer in _layers(self.cache):
            layer.keys, layer.values = layer.keys[..., first:, :], layer.values[..., first:, :]

    def merge(self, other: KVBatch) -> None:
        """Append ``other``'s rows (prefilled separately) after this batch's."""
        width = max(self.attention.shape[1], other.attention.shape[1])
        for mine, theirs in zip(_layers(self.cache), _layers(other.cache)):
            mine.keys = torch.cat([_left_pad(mine.keys, width), _left_pad(theirs.keys, width)])
            mine.values = torch.cat([_left_pad(mine.values, width), _left_pad(theirs.values, width)])
        self.attention = torch.cat([_left_pad_mask(self.attention, width), _left_pad_mask(other.attention, width)])
        self.rows = self.rows + other.rows
        self.next_pos = torch.cat([self.next_pos, other.next_pos])
        self.logits = torch.cat([self.logits, other.logits])

    def __len__(self) -> int:
        return len(self.rows)


def _layers(cache) -> list:
    from transformers.cache_utils import DynamicLayer

    layers = cache.layers
    if not all(type(layer) is DynamicLayer for layer in layers):
        kinds = sorted({type(layer).__name__ for layer in layers})
        raise NotImplementedError(f"continuous batching needs full-attention KV caches, this model has {kinds}")
    return layers


def _left_pad(x: torch.Tensor, width: int) -> torch.Tensor:
    """[B, H, T, D] -> [B, H, width, D], zeros before the existing positions."""
    missing = width - x.shape[-2]
    if missing == 0:
        return x
    return torch.cat([x.new_zeros((*x.shape[:-2], missing, x.shape[-1])), x], dim=-2)


def _left_pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - mask.shape[1]
    return mask if missing == 0 else torch.cat([mask.new_zeros((mask.shape[0], missing)), mask], dim=1)
