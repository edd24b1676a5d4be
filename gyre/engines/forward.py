"""Forward passes that turn a TrainBatch into per-token log-probs, shared by trainer and reference."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from gyre.engines import memory
from gyre.models.logprobs import entropy_from_logits, token_logprobs
from gyre.types import TrainBatch, select_rows, trim_to_length


def micro_batches(batch: TrainBatch, size: int) -> Iterator[TrainBatch]:
    """Consecutive slices of at most ``size`` rows, each trimmed of all-padding columns."""
    for start in range(0, len(batch), size):
        yield trim_to_length(select_rows(batch, slice(start, start + size)))


def sequence_logprobs(model: torch.nn.Module, batch: TrainBatch, device: torch.device, temperature: float,
                      autocast_dtype: torch.dtype | None = None, entropy: bool = False,
                      entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs [B, L] (and entropies) aligned with ``batch.input_ids``; position 0 is 0."""
    ids = batch.input_ids.to(device)
    ctx = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    with ctx:
        # Rows are right-padded, so under causal attention no real token can see a pad: the padding mask
        # changes nothing for real tokens, and leaving it out keeps attention on the fused causal path.
        # Packed rows: positions restart at each example, and transformers then keeps attention within it.
        packed = {} if batch.position_ids is None else {"position_ids": batch.position_ids.to(device)}
        logits = model(input_ids=ids, use_cache=False, **packed).logits
    logits = logits[:, :-1]
    lp = torch.zeros(ids.shape, dtype=torch.float32, device=device)
    lp[:, 1:] = token_logprobs(logits, ids[:, 1:], temperature)
    ent = None
    if entropy:
        # Only response positions: a full-vocabulary softmax over the prompt would cost [B, L, V] floats.
        where = batch.response_mask[:, 1:].to(device).bool()
        picked = logits[where] if entropy_grad else logits.detach()[where]
        ent = torch.zeros(ids.shape, dtype=torch.float32, device=device)
        ent[:, 1:][where] = entropy_from_logits(picked[None], temperature)[0]
    return lp, ent


def sequence_values(model: torch.nn.Module, batch: TrainBatch, device: torch.device,
                    autocast_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Critic values [B, L] aligned like the log-probs: index p is the value of the state before token p
    (the head's output at position p - 1); position 0 is 0."""
    ids = batch.input_ids.to(device)
    ctx = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    with ctx:
        out = model(input_ids=ids, use_cache=False).logits  # [B, L, 1] from the value head
    values = torch.zeros(ids.shape, dtype=torch.float32, device=device)
    values[:, 1:] = out[:, :-1, 0].float()
    return values


@torch.no_grad()
def batch_logprobs(model: torch.nn.Module, batch: TrainBatch, device: torch.device, temperature: float,
                   micro_batch_size: int, autocast_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Log-probs of a whole batch in micro-batches, [B, L] float32 on CPU."""
    return _batched(lambda micro: sequence_logprobs(model, micro, device, temperature, autocast_dtype)[0],
                    batch, micro_batch_size)


@torch.no_grad()
def batch_values(model: torch.nn.Module, batch: TrainBatch, device: torch.device, micro_batch_size: int,
                 autocast_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Critic values of a whole batch in micro-batches, [B, L] float32 on CPU."""
    return _batched(lambda micro: sequence_values(model, micro, device, autocast_dtype), batch, micro_batch_size)


def _batched(forward, batch: TrainBatch, micro_batch_size: int) -> torch.Tensor:
    width = batch.input_ids.shape[1]
    outs = []
    for micro in micro_batches(batch, micro_batch_size):
        out = forward(micro)
        outs.append(torch.nn.functional.pad(out.cpu(), (0, width - out.shape[1])))
    return torch.cat(outs) if outs else torch.zeros(batch.input_ids.shape)


class ReferenceModel:
    """A frozen copy of the initial policy that scores tokens for the KL term."""

    def __init__(self, model_path: str, dtype: str, device: torch.device, trust_remote_code: bool = False,
                 micro_batch_size: int = 16, start_offloaded: bool = False, attn_implementation: str | None = None):
        from gyre.models.loading import load_causal_lm

        self.device = device
        self.model = load_causal_lm(model_path, dtype, trust_remote_code, "cpu" if start_offloaded else str(device),
                                    attn_implementation)
        self.model.requires_grad_(False)
        self.micro_batch_size = micro_batch_size

    def compute_logprobs(self, batch: TrainBatch, temperature: float) -> torch.Tensor:
        return batch_logprobs(self.model, batch, self.device, temperature, self.micro_batch_size)

    def offload(self) -> None:
        memory.offload(self.model, self.device)

    def reload(self) -> None:
        memory.reload(self.model, self.device)
