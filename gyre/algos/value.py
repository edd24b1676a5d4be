"""Critic (value-function) loss and diagnostics.

PPO's clipped value loss (Schulman et al., arXiv 1707.06347; the clipped form as in OpenAI baselines and ROLL
``value_clip``): ``0.5 * max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)``, the second term only when a
clip range is set. Targets R come from ``gae_advantages`` (arXiv 1506.02438).
"""

from __future__ import annotations

import torch

from gyre.algos.stats import masked_mean, masked_var


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
               clip: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token critic loss.

    Args:
        values: [B, T] current critic values (with gradient).
        old_values: [B, T] critic values when the batch was scored (no gradient).
        returns: [B, T] targets R (no gradient).
        clip: value clip range c; None disables the clipped term.

    Returns:
        (per-token loss [B, T], clip flag [B, T] float: 1 where the clipped term is strictly the larger, i.e. the
        vf clip fraction once averaged over the mask). Aggregate the loss with ``aggregate_loss``.
    """
    returns = returns.detach()
    unclipped = (values - returns).square()
    if clip is None:
        return 0.5 * unclipped, torch.zeros_like(unclipped.detach())
    if clip < 0:
        raise ValueError(f"value clip must be >= 0 or None, got {clip}")
    old = old_values.detach()
    clipped_values = old + torch.clamp(values - old, -clip, clip)
    clipped = (clipped_values - returns).square()
    flag = (clipped > unclipped).detach().to(unclipped.dtype)
    return 0.5 * torch.maximum(unclipped, clipped), flag


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var(R - V) / Var(R)`` over the valid tokens (population variances, ddof 0).

    1 is a perfect critic, 0 no better than a constant, negative worse. Returns 0.0 (not NaN) when Var(R) is
    numerically 0 (constant returns, including an empty mask), so the metric never poisons logged averages;
    "numerically" is relative to mean(R^2), because rounding leaves ~1e-34 of variance in a constant vector.

    Args:
        values: [B, T] critic values.
        returns: [B, T] return targets.
        mask: [B, T] 1 for valid tokens.
    """
    v, r = values.detach().to(torch.float64), returns.detach().to(torch.float64)
    m = mask.to(torch.float64)
    var_r = float(masked_var(r, m, ddof=0))
    if var_r <= 1e-12 * float(masked_mean(r.square(), m)):
        return 0.0
    return 1.0 - float(masked_var(r - v, m, ddof=0)) / var_r
