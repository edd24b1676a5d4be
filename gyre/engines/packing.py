"""The tensors a model sees for one micro-batch: padded rows, or rows packed into one sequence.

A packed micro-batch is the concatenation of its rows' real tokens, [1, N], with position ids that
restart at 0 on every row, so each row gets the rotary positions it has alone. Attention must not cross
rows: eager and sdpa get a block-diagonal causal mask [1, 1, N, N]; flash-attention and flex-attention
get the position ids alone, from which transformers finds the row boundaries (flash-attention's
variable-length kernel; a block mask for flex). Results come back to the padded [B, L] layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gyre.types import TrainBatch

_MASKED_KINDS = ("eager", "sdpa")
"""Attention kernels that take the block-diagonal mask itself; the others find rows from position ids."""


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
        if attn_implementation in _MASKED_KINDS:
            inputs["attention_mask"] = block_causal_mask(self.lengths, device, attn_implementation)
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


def takes_pack_mask(model: torch.nn.Module) -> bool:
    """A packed micro-batch gets the block-diagonal mask itself (its cost grows with the square of the
    packed length), rather than row boundaries from position ids."""
    return attn_implementation_of(model) in _MASKED_KINDS


def attn_implementation_of(model: torch.nn.Module) -> str | None:
    """The attention kernel a (possibly wrapped) Hugging Face model runs."""
    config = getattr(getattr(model, "module", model), "config", None)
    return getattr(config, "_attn_implementation", None)
