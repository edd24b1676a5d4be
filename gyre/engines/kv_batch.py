"""The running batch of a continuously batching HF engine: rows, their KV cache, masks and positions.

Rows join (``merge``) and leave (``select``) between decoding steps. Caches of rows prefilled at
different times have different lengths; they are aligned by left-padding keys and values with zeros
under a zero attention mask, and columns that are padding in every row are trimmed away (``trim``).

A decoding step appends one column to every layer's keys and values. transformers' ``DynamicLayer``
does that by concatenation, a copy of the whole cache per step (quadratic in the answer's length);
``reserve`` gives each layer room for the columns its rows may still sample, and ``RoomyLayer`` writes
a step's column into that room in place. The room is taken again only when the batch changes (rows
join or leave), which copies the cache once anyway.
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

    def needs_room(self) -> bool:
        """Some layer cannot take the next step's column in place (the batch changed since ``reserve``)."""
        return any(_cached(layer) and room(layer.keys) == 0 for layer in self.cache.layers)

    def reserve(self, columns: int) -> None:
        """Room for ``columns`` more cache columns in every layer that lacks room for the next one: the
        following steps write into it instead of copying the cache (``RoomyLayer``)."""
        for layer in self.cache.layers:
            if _cached(layer) and room(layer.keys) == 0:
                layer.keys, layer.values = _with_room(layer.keys, columns), _with_room(layer.values, columns)

    def __len__(self) -> int:
        return len(self.rows)


def roomy_cache(config):
    """A ``DynamicCache`` for ``config`` whose layers append in place where ``KVBatch.reserve`` left room."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=config)
    for layer in cache.layers:
        if type(layer) is DynamicLayer:  # others (sliding windows) keep their own update
            _roomy(layer)
    return cache


def room(x: torch.Tensor) -> int:
    """Columns ``x`` ([B, H, T, D], a view of a wider buffer) may grow into along T in place: 0 unless its
    strides are those of a [B, H, C, D] buffer with C > T and its columns end before the buffer's do."""
    b, h, t, d = x.shape
    stride = x.stride()
    if stride[3] != 1 or stride[2] != d or stride[1] % d or stride[0] != h * stride[1]:
        return 0
    width = stride[1] // d
    first = (x.storage_offset() % stride[1]) // d
    free = width - first - t
    # The storage must really hold the grown view (strides alone could describe a buffer that is not there).
    end = x.storage_offset() + (b - 1) * stride[0] + (h - 1) * stride[1] + (t + free) * d
    return free if free > 0 and end * x.element_size() <= x.untyped_storage().nbytes() else 0


def append_in_place(x: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """``x`` with ``new``'s columns after its own, written into the room after ``x`` (no copy of ``x``)."""
    b, h, t, d = x.shape
    grown = x.as_strided((b, h, t + new.shape[2], d), x.stride(), x.storage_offset())
    grown[:, :, t:] = new
    return grown


def _cached(layer) -> bool:
    return type(layer) is _ROOMY and layer.is_initialized and layer.keys is not None and layer.keys.dim() == 4


def _with_room(x: torch.Tensor, columns: int) -> torch.Tensor:
    b, h, t, d = x.shape
    buffer = x.new_empty((b, h, t + columns, d))
    buffer[:, :, :t] = x
    return buffer[:, :, :t]


def _roomy(layer):
    """``layer`` (a ``DynamicLayer``) made a ``RoomyLayer``, keeping its state."""
    layer.__class__ = _roomy_class()
    return layer


def _roomy_class():
    global _ROOMY
    if _ROOMY is None:
        from transformers.cache_utils import DynamicLayer

        class RoomyLayer(DynamicLayer):
            """A ``DynamicLayer`` that appends into reserved room in place, and concatenates (as its base
            does) where there is none."""

            def update(self, key_states, value_states, *args, **kwargs):
                if (self.is_initialized and self.keys.dim() == 4 and room(self.keys) >= key_states.shape[2]
                        and room(self.values) >= value_states.shape[2]):
                    self.keys = append_in_place(self.keys, key_states)
                    self.values = append_in_place(self.values, value_states)
                    return self.keys, self.values
                return super().update(key_states, value_states, *args, **kwargs)

        _ROOMY = RoomyLayer
    return _ROOMY


_ROOMY = None


def _layers(cache) -> list:
    from transformers.cache_utils import DynamicLayer

    layers = cache.layers
    if not all(type(layer) in (DynamicLayer, _ROOMY) for layer in layers):
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
