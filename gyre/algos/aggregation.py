"""Loss aggregation with global denominators.

The denominator of a token-mean is a property of the whole optimizer-step batch, not of one micro-batch
or one data-parallel rank (the global-denominator rule; ROLL ``apply_loss_scale``). The data-parallel
backend averages gradients over ``dp_size`` ranks and each rank sums its micro-batch gradients, so a
micro-batch contributes ``masked_sum * dp_size / global_tokens``: the result then equals the
single-device token-mean whatever the split.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from gyre.algos.stats import masked_sum

AggMode = Literal["token-mean"]


@dataclass(frozen=True)
class LossDenominator:
    """Global counts of one optimizer step's batch, over all ranks and micro-batches."""

    tokens: float
    """Valid (mask = 1) tokens in the whole optimizer-step batch."""
    dp_size: int = 1
    """Ranks whose gradients the backend averages."""


def aggregate_loss(token_values: torch.Tensor, mask: torch.Tensor, mode: AggMode,
                   denom: LossDenominator) -> torch.Tensor:
    """This micro-batch's share of the aggregated loss.

    Args:
        token_values: [B, T] per-token loss.
        mask: [B, T] 1 for tokens that count.
        mode: "token-mean" = sum over every valid token of the step batch / number of valid tokens.
        denom: global counts for the optimizer step this micro-batch belongs to.
    """
    if mode == "token-mean":
        return masked_sum(token_values, mask) * (denom.dp_size / max(denom.tokens, 1.0))
    raise ValueError(f"unknown loss aggregation {mode!r}")
