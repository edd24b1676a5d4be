"""What every policy loss returns (``PolicyLossOutput``) and the small helpers that build its flags.

Shared by ``gyre.algos.policy_loss`` and ``gyre.algos.loss_variants``, so the variants can live in a
module of their own while ``POLICY_LOSSES`` lists them all.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PolicyLossOutput:
    """Per-token results, all [B, T]; aggregate ``token_loss`` with ``aggregate_loss``."""

    token_loss: torch.Tensor
    """Per-token loss, already 0 (with zero gradient) where the variant masks a token out."""
    ratio: torch.Tensor
    """Detached ratio the variant used: token ratio; broadcast sequence ratio for GSPO (geometric mean of the
    clipped token ratios for GMPO); proximal ratio for decoupled PPO."""
    clipped_low: torch.Tensor
    """1.0 where the lower bound limits the gradient (PPO: rho < 1 - eps_low and A < 0, gradient 0 there;
    IS-weight variants: the weight is truncated from below)."""
    clipped_high: torch.Tensor
    """1.0 where the upper bound limits the gradient (PPO: rho > 1 + eps_high and A > 0, or the dual-clip cap
    rho > c with A < 0; IS-weight variants: the weight is truncated from above)."""
    dropped: torch.Tensor | None = None
    """1.0 where the variant's own mask removed the token (CISPO unified mask, Clip-Cov); None if the variant
    never drops."""
    penalised: torch.Tensor | None = None
    """1.0 where the variant added a penalty to the token's loss (KL-Cov); None if it never does."""


def flag(condition: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Bool condition -> float flag [B, T] in ``like``'s dtype and shape (advantages may broadcast)."""
    return condition.expand_as(like).to(like.dtype)


def zeros(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(like, dtype=like.dtype).detach()
