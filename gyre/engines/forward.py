"""Forward passes that turn a TrainBatch into per-token log-probs or values, shared by trainer and reference.

Each takes a ``ForwardContext``: the device, the autocast dtype and the role's memory levers (micro-batches
by token budget, padding removed or rows packed, log-probs in chunks; ``gyre.engines.microbatch``). Every
lever computes the same numbers as the plain path, in the same padded [B, L] layout.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from gyre.engines import memory
from gyre.engines.logit_head import ChunkedLogprobHead, check_chunkable, output_layer, swapped_output_layer
from gyre.engines.microbatch import plan_micro_batches
from gyre.engines.packing import RowLayout, attn_implementation_of, takes_dense_pack_mask
from gyre.engines.specs import MemoryLevers
from gyre.models.logprobs import entropy_from_logits, token_logprobs
from gyre.types import TrainBatch, select_rows, trim_to_length


@dataclass(frozen=True)
class ForwardContext:
    """Where a role's forward passes run and how."""

    device: torch.device
    autocast_dtype: torch.dtype | None = None
    """Compute dtype under autocast (GPU trainers with bf16/fp16 models); None: the weights' dtype."""
    levers: MemoryLevers = field(default_factory=MemoryLevers)

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)


def micro_batches(batch: TrainBatch, groups: list[torch.Tensor]) -> list[TrainBatch]:
    """The rows of each group (``plan_micro_batches``), each trimmed of all-padding columns."""
    return [trim_to_length(select_rows(batch, g)) for g in groups]


def sequence_logprobs(model: torch.nn.Module, batch: TrainBatch, fwd: ForwardContext, temperature: float,
                      entropy: bool = False, entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs [B, L] (and entropies on response tokens) aligned with ``batch.input_ids``;
    0 at position 0 and on padding."""
    layout = RowLayout.of(batch, fwd.levers.pack)
    inputs = layout.model_inputs(batch.input_ids.to(fwd.device), attn_implementation_of(model))
    targets = _next(inputs["input_ids"])
    # Entropies only where the next token is a response token: a full-vocabulary softmax over the prompt
    # would cost another [tokens, V] floats.
    where = _next(layout.to_model(batch.response_mask.to(fwd.device))).bool() if entropy else None
    chunk = fwd.levers.logprob_chunk_tokens
    if chunk:
        head = ChunkedLogprobHead(output_layer(model), targets, temperature, chunk, where)
        with fwd.autocast(), swapped_output_layer(model, head):
            stats = model(**inputs, use_cache=False).logits
        next_lp, next_ent = stats[..., 0], stats[..., 1] if entropy else None
        if next_ent is not None and not entropy_grad:
            next_ent = next_ent.detach()
    else:
        with fwd.autocast():
            logits = model(**inputs, use_cache=False).logits
        next_lp = token_logprobs(logits, targets, temperature)
        next_ent = None
        if entropy:
            picked = logits[where] if entropy_grad else logits.detach()[where]
            next_ent = torch.zeros(targets.shape, dtype=torch.float32, device=fwd.device)
            next_ent[where] = entropy_from_logits(picked[None], temperature)[0]
    lp = layout.next_token_to_rows(next_lp)
    return lp, layout.next_token_to_rows(next_ent) if next_ent is not None else None


def sequence_values(model: torch.nn.Module, batch: TrainBatch, fwd: ForwardContext) -> torch.Tensor:
    """Critic values [B, L] aligned like the log-probs: index p is the value of the state before token p
    (the head's output at position p - 1); 0 at position 0 and on padding."""
    layout = RowLayout.of(batch, fwd.levers.pack)
    inputs = layout.model_inputs(batch.input_ids.to(fwd.device), attn_implementation_of(model))
    with fwd.autocast():
        out = model(**inputs, use_cache=False).logits  # [rows, tokens, 1] from the value head
    return layout.next_token_to_rows(out[..., 0].float())


@torch.no_grad()
def batch_logprobs(model: torch.nn.Module, batch: TrainBatch, fwd: ForwardContext, temperature: float,
                   groups: list[torch.Tensor]) -> torch.Tensor:
    """Log-probs of a whole batch, one forward pass per group of rows, [B, L] float32 on CPU."""
    return _batched(lambda micro: sequence_logprobs(model, micro, fwd, temperature)[0], batch, groups)


@torch.no_grad()
def batch_values(model: torch.nn.Module, batch: TrainBatch, fwd: ForwardContext,
                 groups: list[torch.Tensor]) -> torch.Tensor:
    """Critic values of a whole batch, one forward pass per group of rows, [B, L] float32 on CPU."""
    return _batched(lambda micro: sequence_values(model, micro, fwd), batch, groups)


def _batched(forward, batch: TrainBatch, groups: list[torch.Tensor]) -> torch.Tensor:
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    for rows, micro in zip(groups, micro_batches(batch, groups)):
        result = forward(micro).cpu()
        out[rows, :result.shape[1]] = result
    return out


def _next(values: torch.Tensor) -> torch.Tensor:
    """Each position's next token (the one its output predicts); the last position gets that of position 0
    (its prediction is discarded)."""
    return torch.roll(values, -1, dims=-1)


class ReferenceModel:
    """A frozen copy of the initial policy that scores tokens for the KL term."""

    def __init__(self, model_path: str, dtype: str, device: torch.device, trust_remote_code: bool = False,
                 micro_batch_size: int = 16, start_offloaded: bool = False, attn_implementation: str | None = None,
                 levers: MemoryLevers | None = None):
        from gyre.engines.pack_attention import role_attention
        from gyre.models.loading import load_causal_lm

        levers = levers or MemoryLevers()
        self.model = load_causal_lm(model_path, dtype, trust_remote_code, "cpu" if start_offloaded else str(device),
                                    role_attention(attn_implementation, device.type, levers.pack))
        self.model.requires_grad_(False)
        self.micro_batch_size = micro_batch_size
        self.fwd = ForwardContext(device, levers=levers)
        if self.fwd.levers.logprob_chunk_tokens:
            check_chunkable(self.model, next(self.model.parameters()).device, "reference.logprob_chunk_tokens")

    @property
    def device(self) -> torch.device:
        return self.fwd.device

    def compute_logprobs(self, batch: TrainBatch, temperature: float) -> torch.Tensor:
        groups = plan_micro_batches(batch.attention_mask.sum(dim=1), self.micro_batch_size, self.fwd.levers,
                                    takes_dense_pack_mask(self.model))
        return batch_logprobs(self.model, batch, self.fwd, temperature, groups)

    def offload(self) -> None:
        memory.offload(self.model, self.device)

    def reload(self) -> None:
        memory.reload(self.model, self.device)
