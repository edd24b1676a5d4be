"""Per-token policy-gradient losses.

PPO clip: Schulman et al., "Proximal Policy Optimization Algorithms" (arXiv 1707.06347), with
separate lower and upper clip bounds (clip-higher, DAPO arXiv 2503.14476, when clip_high > clip_low):
``l_t = -min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t)``, ``rho_t = exp(logp - logp_old)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PolicyLossOutput:
    """Per-token results, all [B, T]; aggregate ``token_loss`` with ``aggregate_loss``."""

    token_loss: torch.Tensor
    ratio: torch.Tensor
    clipped_low: torch.Tensor
    """1.0 where the lower bound is active (rho < 1 - eps_low and A < 0): the gradient is zero there."""
    clipped_high: torch.Tensor
    """1.0 where the upper bound is active (rho > 1 + eps_high and A > 0)."""


def ppo_clip_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                  clip_low: float = 0.2, clip_high: float = 0.2) -> PolicyLossOutput:
    """PPO clipped surrogate, per token.

    Args:
        logprobs: [B, T] log pi_theta of the sampled tokens (with gradient).
        old_logprobs: [B, T] log pi_old of the same tokens (no gradient).
        advantages: [B, T] (or broadcastable) advantages.
    """
    log_ratio = logprobs - old_logprobs.detach()
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    token_loss = -torch.minimum(unclipped, clipped)
    with torch.no_grad():
        low = ((ratio < 1.0 - clip_low) & (advantages < 0)).to(logprobs.dtype)
        high = ((ratio > 1.0 + clip_high) & (advantages > 0)).to(logprobs.dtype)
    return PolicyLossOutput(token_loss=token_loss, ratio=ratio.detach(), clipped_low=low, clipped_high=high)
