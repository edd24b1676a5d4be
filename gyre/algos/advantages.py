"""Outcome advantages for critic-free RL.

GRPO: DeepSeekMath (Shao et al., arXiv 2402.03300), group-normalised outcome rewards
``A_i = (r_i - mean_g r) / (std_g r + eps)`` broadcast over the response tokens.
Deviation: the std's ddof is a parameter (1 by default, torch's and TRL's convention); ROLL's choice
is not pinned down (see the reference notes).
"""

from __future__ import annotations

import torch


def group_normalized_advantages(rewards: torch.Tensor, eps: float = 1e-6, ddof: int = 1) -> torch.Tensor:
    """GRPO advantages.

    Args:
        rewards: [num_groups, G] outcome rewards, one row per prompt, G >= 2 samples each.
        eps: added to the std so that a group of identical rewards gets advantage 0, not NaN.
        ddof: 1 for the sample std, 0 for the population std.

    Returns:
        [num_groups, G] advantages; each row sums to zero.
    """
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be [num_groups, G>=2], got shape {tuple(rewards.shape)}")
    rewards = rewards.to(torch.float64 if rewards.dtype == torch.float64 else torch.float32)
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True, correction=ddof)
    return (rewards - mean) / (std + eps)
