"""The tensors a model sees for one micro-batch: padded rows, or rows packed into one sequence.

A packed micro-batch is the concatenation of its rows' real tokens, [1, N], with position ids that
restart at 0 on every row, so each row gets the rotary positions it has alone. Attention must not cross
rows, and each kernel gets that in its own form (``gyre.engines.pack_attention`` says which and what it
costs): eager and sdpa a dense block-diagonal causal mask [1, 1, N, N]; flex-attention a ``BlockMask``
over the same pattern that lists only the tiles a row covers; flash-attention the position ids alone,
from which transformers finds the row boundaries (its variable-length kernel). Results come back to the
padded [B, L] layout.

Why gyre builds flex-attention's mask itself: transformers 5.x would derive one from the position ids
too (``masking_utils.find_packed_sequence_indices``, when no attention mask and no cache is given), but
by evaluating the mask on all N x N pairs in a ``torch.compile``d ``create_block_mask`` at every
forward pass, and only for models that build their masks through ``masking_utils``. A 4-D mask (dense or
``BlockMask``) is passed through by transformers unchanged, to every layer: sliding-window layers (Gemma,
gpt-oss) then attend to their whole row, a limit the dense mask shares.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gyre.engines.pack_attention import BLOCK_MASK_KINDS, DENSE_MASK_KINDS
from gyre.types import TrainBatch

FLEX_BLOCK = 128
"""Tile size of flex-attention's block mask (torch's default, which its kernels are tuned for)."""


@dataclass(frozen=True)
class RowLayout:
    """Where the real tokens of a right-padded [B, L] micro-batch sit in the model's input."""

    lengths: torch.Tensor
    """[B] real tokens of each row."""
    width: int
    """L, the padded width results are returned in."""
    packed: bool
    """True: one [1, N] sequence of every row's tokens; False: the padded [B, L] rows as they are."""
    row_positions: torch.Tensor | None = None
    """[B, L] position ids of rows that already hold several examples each (``gyre sft`` packing), which
    restart at every example; None: 0, 1, ... along each row."""

    @classmethod
    def of(cls, batch: TrainBatch, packed: bool) -> RowLayout:
        """The layout of ``batch``; rows that already hold packed examples keep their own positions and
        are not packed again (concatenating them would gain little and lose their example boundaries)."""
        mask = batch.attention_mask
        positions = batch.position_ids
        return cls(mask.sum(dim=1).cpu(), int(mask.shape[1]), packed and positions is None, positions)

    def to_model(self, values: torch.Tensor) -> torch.Tensor:
        """[B, L] per-token values -> the model's layout ([1, N] packed, else unchanged)."""
        if not self.packed:
            return values
        return values[self._real(values.device)][None]

    def next_token_to_rows(self, values: torch.Tensor) -> torch.Tensor:
        """Per-position results about the *next* token in the model's layout (the log-prob of token p + 1,
        the value of the state before it) -> [B, L] aligned with ``input_ids``: index p holds what
        position p - 1 computed, 0 at position 0 and on padding (where a row's last position or a packed
        row's boundary would predict a token of no row)."""
        rows = len(self.lengths)
        if self.packed:
            padded = values.new_zeros((rows, self.width))
            padded[self._real(values.device)] = values[0]
            values = padded
        out = values.new_zeros((rows, self.width))
        out[:, 1:] = values[:, :-1]
        return out * self._real(values.device)

    def position_ids(self, device: torch.device) -> torch.Tensor:
        """[1, N]: 0, 1, ... restarting on every row."""
        lengths = self.lengths.to(device)
        starts = torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)
        return (torch.arange(len(starts), device=device) - starts)[None]

    def model_inputs(self, input_ids: torch.Tensor, attn_implementation: str | None) -> dict:
        """Keyword arguments of the model's forward for this micro-batch (``input_ids`` [B, L] on the device)."""
        if not self.packed:
            # Right padding under causal attention: no real token sees a pad, so no mask is needed and
            # attention stays on the fused causal path. Rows of packed examples: positions restart at each
            # example, and transformers then keeps attention within it.
            if self.row_positions is not None:
                return {"input_ids": input_ids, "position_ids": self.row_positions.to(input_ids.device)}
            return {"input_ids": input_ids}
        device = input_ids.device
        inputs = {"input_ids": self.to_model(input_ids), "position_ids": self.position_ids(device)}
        if attn_implementation in DENSE_MASK_KINDS:
            inputs["attention_mask"] = block_causal_mask(self.lengths, device, attn_implementation)
        elif attn_implementation in BLOCK_MASK_KINDS:
            inputs["attention_mask"] = flex_block_mask(self.lengths, device)
        return inputs

    def _real(self, device: torch.device) -> torch.Tensor:
        return torch.arange(self.width, device=device)[None] < self.lengths.to(device)[:, None]


def block_causal_mask(lengths: torch.Tensor, device: torch.device, kind: str) -> torch.Tensor:
    """[1, 1, N, N] mask of packed rows: token i attends to token j iff both are in one row and j <= i.
    sdpa: bool, True where attention is allowed; eager: additive float32, 0 there and -inf-like elsewhere."""
    row = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths.to(device))
    n = len(row)
    allowed = (row[:, None] == row[None, :]) & torch.ones(n, n, dtype=torch.bool, device=device).tril()
    if kind == "sdpa":
        return allowed[None, None]
    mask = torch.zeros(n, n, dtype=torch.float32, device=device)
    return mask.masked_fill_(~allowed, torch.finfo(torch.float32).min)[None, None]


def flex_block_mask(lengths: torch.Tensor, device: torch.device, block: int = FLEX_BLOCK):
    """flex-attention's ``BlockMask`` [1, 1, N, N] of packed rows of ``lengths`` tokens: token q attends to
    token kv iff both are in one row and kv <= q (``block_causal_mask``'s pattern).

    The tiles are found from the row boundaries, O((N / block)^2), where ``create_block_mask`` would
    evaluate the mask on all N^2 pairs (it gives the same tiles; tested). For q-tile i and kv-tile j
    (``first``/``last``: the row of a tile's first/last token; rows are contiguous and in order):
    some pair is allowed iff j == i (the diagonal), or j < i and tile j's last row reaches tile i's first
    (``last[j] >= first[i]``); every pair is allowed iff both tiles lie in one row (``first[j] == last[i]``),
    kv-tile j ends no later than q-tile i starts, and both are whole (torch counts the padding past N as
    masked). The kernel skips tiles with no allowed pair and applies the mask inside partial ones only."""
    from torch.nn.attention.flex_attention import BlockMask  # imported here: flex is optional and slow to import

    lengths = lengths.to(device)
    row = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)
    n = len(row)

    def same_row_causal(b, h, q, kv):
        return (row[q] == row[kv]) & (q >= kv)

    starts = torch.arange(0, n, block, device=device)
    ends = torch.clamp(starts + block, max=n) - 1
    first, last = row[starts][:, None], row[ends][:, None]  # [tiles, 1]: as q-tiles; .T: as kv-tiles
    whole = (starts + block <= n)[:, None]
    tile = torch.arange(len(starts), device=device)[:, None]
    some = ((tile.T < tile) & (last.T >= first)) | (tile.T == tile)
    full = (first.T == last) & (ends[None, :] <= starts[:, None]) & whole & whole.T
    partial = some & ~full
    return BlockMask.from_kv_blocks(*_ordered(partial), *_ordered(full), BLOCK_SIZE=block,
                                    mask_mod=same_row_causal, seq_lengths=(n, n))


def _ordered(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[q-tiles, kv-tiles] bool -> (count [1, 1, q], kv-tile indices [1, 1, q, kv], the allowed ones first in
    ascending order), as ``create_block_mask`` lists them."""
    dense = tiles.to(torch.int32)[None, None]
    order = torch.argsort(dense, dim=-1, descending=True, stable=True)
    return dense.sum(dim=-1, dtype=torch.int32), order.to(torch.int32)


def takes_dense_pack_mask(model: torch.nn.Module) -> bool:
    """A packed micro-batch gets the dense [N, N] mask (eager, sdpa: memory and work grow with the square of
    the packed length), not a block-sparse mask (flex) or row boundaries from position ids (flash)."""
    return attn_implementation_of(model) in DENSE_MASK_KINDS


def attn_implementation_of(model: torch.nn.Module) -> str | None:
    """The attention kernel a (possibly wrapped) Hugging Face model runs."""
    config = getattr(getattr(model, "module", model), "config", None)
    return getattr(config, "_attn_implementation", None)
