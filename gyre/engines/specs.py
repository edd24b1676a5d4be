"""What a trainer backend is configured with: its optimizer, learning-rate schedule and memory levers.

Plain frozen records without torch, so the config can declare its sections from them
(``gyre.config.base.section_from_spec``: one declaration of each field, its bounds and its documentation)
and build them back by name; the trainer (``gyre.engines.trainer``) and the forward passes
(``gyre.engines.forward``) take them as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gyre.algos.tables import knob


@dataclass(frozen=True)
class OptimizerSpec:
    """AdamW (torch.optim.AdamW; fused on GPU) over the trainable parameters."""

    lr: float = knob(1e-5, gt=0)
    """Peak learning rate (the scheduler scales it each optimizer step)."""
    weight_decay: float = knob(0.0, ge=0)
    """Decoupled weight decay (AdamW's), applied to every trainable parameter."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW's decay rates of the first and second moment estimates."""
    eps: float = knob(1e-8, gt=0)
    """AdamW's term added to the second moment's square root, for numerical stability."""


@dataclass(frozen=True)
class SchedulerSpec:
    """The learning rate over the run's optimizer steps."""

    type: Literal["constant", "linear", "cosine"] = "constant"
    """After warm-up: constant keeps the peak; linear and cosine decay it to min_lr_ratio x the peak at the
    last step."""
    warmup_steps: int = knob(0, ge=0)
    """Optimizer steps of linear warm-up from 0."""
    min_lr_ratio: float = knob(0.0, ge=0, le=1)
    """For linear and cosine decay: the final learning rate as a fraction of the peak."""


RemovePadding = Literal["none", "sort", "pack"]


@dataclass(frozen=True)
class MemoryLevers:
    """How a role cuts a batch into forward passes and computes log-probs (the role's config section)."""

    micro_batch_tokens: int | None = None
    """Token budget of one forward pass (padding counted unless packed); None cuts by row count."""
    remove_padding: RemovePadding = "none"
    """none: consecutive rows, right-padded; sort: rows longest-first, so each micro-batch carries little
    padding; pack: rows longest-first, each micro-batch concatenated into one sequence without padding."""
    logprob_chunk_tokens: int | None = None
    """Log-probs from the final hidden states this many tokens at a time; None: all logits at once."""

    @property
    def pack(self) -> bool:
        return self.remove_padding == "pack"

    def describe(self, rows: int, logprobs: bool = True) -> str:
        """One line for ``gyre check``: what is on (``rows``: the row count used without a token budget;
        ``logprobs``: the role computes log-probs)."""
        cut = f"<= {self.micro_batch_tokens} tokens" if self.micro_batch_tokens else f"<= {rows} rows"
        padding = {"none": "padded rows", "sort": "rows sorted by length (little padding)",
                   "pack": "rows packed without padding"}[self.remove_padding]
        text = f"micro-batches {cut}, {padding}"
        if logprobs:
            text += (f", log-probs in chunks of {self.logprob_chunk_tokens} tokens" if self.logprob_chunk_tokens
                     else ", log-probs from the full logits")
        return text
