"""Loss aggregation with global denominators.

Modes (ROLL ``loss_agg_mode``), with l the per-token loss, m the mask, len_i = sum_t m_it:
- ``token-mean``: sum m*l / N_tok (DAPO arXiv 2503.14476, Lite PPO arXiv 2508.08221);
- ``seq-mean-token-sum``: sum m*l / N_seq;
- ``seq-mean-token-mean``: sum_i (sum_t m*l / len_i) / N_seq (original GRPO, arXiv 2402.03300; ROLL default);
- ``seq-mean-token-sum-norm``: sum m*l / (N_seq * norm_length) (Dr.GRPO, arXiv 2503.20783);
- ``token-sum``: sum m*l, no normaliser (verl's and SkyRL's sum reduction; the loss, and so the gradient,
  grows with the number of tokens in the step, so the learning rate must be set with the batch's size in mind).
Deviation: ROLL's ``seq-mean-token-sum-norm`` divides by the padded length T; gyre takes the constant explicitly
(``norm_length``), because T depends on how a batch was padded or packed.

The denominators are properties of the whole optimizer-step batch, not of one micro-batch or one data-parallel
rank (the global-denominator rule; ROLL ``apply_loss_scale``). The data-parallel backend averages gradients over
``dp_size`` ranks and each rank sums its micro-batch gradients, so a micro-batch contributes its local sum times
``dp_size / global_denominator``: summed over micro-batches and averaged over ranks this equals the single-device
loss whatever the split. N_seq counts rows with at least one valid token; empty rows contribute nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gyre.algos.specs import AggMode
from gyre.algos.stats import masked_sum, where_valid
from gyre.algos.tables import Registry


@dataclass(frozen=True)
class LossDenominator:
    """Global counts of one optimizer step's batch, over all ranks and micro-batches."""

    tokens: float
    """Valid (mask = 1) tokens in the whole optimizer-step batch."""
    sequences: float = 1.0
    """Valid sequences (rows with at least one mask token) in the whole optimizer-step batch."""
    dp_size: int = 1
    """Ranks whose gradients the backend averages."""
    norm_length: float | None = None
    """The constant length of ``seq-mean-token-sum-norm``; required for that mode only."""

    def __post_init__(self) -> None:
        if self.dp_size < 1:
            raise ValueError(f"dp_size must be >= 1, got {self.dp_size}")
        if self.norm_length is not None and self.norm_length <= 0:
            raise ValueError(f"norm_length must be positive, got {self.norm_length}")


def denominator_for(mask: torch.Tensor, dp_size: int = 1, norm_length: float | None = None) -> LossDenominator:
    """Counts of a whole optimizer-step batch.

    Args:
        mask: [B, T] loss mask of every sample of the step (all ranks, all micro-batches).
        dp_size: ranks whose gradients the backend averages.
        norm_length: constant for ``seq-mean-token-sum-norm`` (e.g. the maximum response length).
    """
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T], got shape {tuple(mask.shape)}")
    tokens = float(mask.sum())
    sequences = float((mask.sum(dim=1) > 0).sum())
    return LossDenominator(tokens=tokens, sequences=sequences, dp_size=dp_size, norm_length=norm_length)


def aggregate_loss(token_values: torch.Tensor, mask: torch.Tensor, mode: AggMode,
                   denom: LossDenominator) -> torch.Tensor:
    """This micro-batch's share of the aggregated loss (0-dim).

    Args:
        token_values: [B, T] per-token loss; off-mask entries may hold anything (NaN, inf): they are
            selected away, never multiplied by 0, so they reach neither the loss nor its gradient.
        mask: [B, T] 1 for tokens that count.
        mode: a name of ``AGGREGATIONS`` (see the module docstring).
        denom: global counts for the optimizer step this micro-batch belongs to.
    """
    return AGGREGATIONS.get(mode)(token_values, mask, denom)


# Each share is scaled up by dp_size, because the backend averages over the ranks. Empty step batches give
# 0, not NaN: every denominator is clamped at 1.


def _token_mean(values: torch.Tensor, mask: torch.Tensor, denom: LossDenominator) -> torch.Tensor:
    return masked_sum(values, mask) * (denom.dp_size / max(denom.tokens, 1.0))


def _seq_mean_token_sum(values: torch.Tensor, mask: torch.Tensor, denom: LossDenominator) -> torch.Tensor:
    return masked_sum(values, mask) * (denom.dp_size / max(denom.sequences, 1.0))


def _seq_mean_token_mean(values: torch.Tensor, mask: torch.Tensor, denom: LossDenominator) -> torch.Tensor:
    valid = mask > 0
    per_seq = where_valid(values, valid).sum(dim=1) / valid.sum(dim=1).clamp(min=1)  # len 0 rows: 0
    return per_seq.sum() * (denom.dp_size / max(denom.sequences, 1.0))


def _seq_mean_token_sum_norm(values: torch.Tensor, mask: torch.Tensor, denom: LossDenominator) -> torch.Tensor:
    if denom.norm_length is None:
        raise ValueError("seq-mean-token-sum-norm needs LossDenominator.norm_length (the normalising constant)")
    return masked_sum(values, mask) * (denom.dp_size / (max(denom.sequences, 1.0) * denom.norm_length))


def _token_sum(values: torch.Tensor, mask: torch.Tensor, denom: LossDenominator) -> torch.Tensor:
    return masked_sum(values, mask) * denom.dp_size


AGGREGATIONS: Registry = Registry("loss aggregation", {
    "token-mean": _token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
    "token-sum": _token_sum,
})
"""The aggregation modes by config name (``algorithm.loss.agg``): ``(token_values, mask, denom)`` -> this
micro-batch's share of the step's loss. ``AggMode`` lists the same names for the type checker."""
