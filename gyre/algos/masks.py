"""Sample masks and length shaping from DAPO ("DAPO: An Open-Source LLM RL System at Scale", arXiv 2503.14476).

- ``overlong_mask``: overlong filtering, drop truncated samples from the loss (ROLL ``max_len_mask``).
- ``difficulty_mask``: keep a group only if ``low < mean(r_g) < high`` (ROLL ``difficulty_mask``); with
  (0, 1) on 0/1 rewards this is DAPO's dynamic-sampling filter (0 < #correct < G).
- ``soft_overlong_penalty``: DAPO's soft overlong punishment, added to the reward. ROLL has no such shaping;
  gyre applies it as a reward transform before normalisation.
Masks are float 0/1 so that they multiply straight into the token mask.
"""

from __future__ import annotations

import torch


def overlong_mask(truncated: torch.Tensor) -> torch.Tensor:
    """[B] bool (True = truncated at the length limit) -> [B] float, 0 for truncated samples, 1 otherwise."""
    return (~truncated.bool()).to(torch.float32)


def difficulty_mask(rewards: torch.Tensor, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
    """Keep whole groups whose mean reward lies strictly between ``low`` and ``high``.

    Args:
        rewards: [N, G] outcome rewards, N groups of G samples.
        low: exclusive lower bound on the group mean (ROLL ``difficulty_low_threshold``).
        high: exclusive upper bound (ROLL ``difficulty_high_threshold``).

    Returns:
        [N, G] float, 1 for every sample of a kept group and 0 for every sample of a dropped one.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [N, G], got shape {tuple(rewards.shape)}")
    mean = rewards.to(torch.float64).mean(dim=1)
    keep = (mean > low) & (mean < high)
    return keep.to(torch.float32).unsqueeze(1).repeat(1, rewards.shape[1])


def soft_overlong_penalty(lengths: torch.Tensor, max_len: int, cache_len: int) -> torch.Tensor:
    """DAPO soft overlong punishment.

    With ``L = max_len`` and ``C = cache_len``: 0 if ``l <= L - C``; ``((L - C) - l) / C`` (linear from 0 to -1)
    if ``L - C < l <= L``; -1 if ``l > L``.

    Args:
        lengths: [B] response lengths in tokens.
        max_len: L_max (DAPO: 20480).
        cache_len: L_cache, the soft band before L_max (DAPO: 4096); 0 < cache_len <= max_len.

    Returns:
        [B] float penalties in [-1, 0], to add to the outcome reward.
    """
    if not 0 < cache_len <= max_len:
        raise ValueError(f"need 0 < cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
    length = lengths.to(torch.float64)
    start = max_len - cache_len
    linear = (start - length) / cache_len
    penalty = torch.where(length <= start, torch.zeros_like(length), linear)
    penalty = torch.where(length > max_len, torch.full_like(length, -1.0), penalty)
    return penalty.to(torch.float32)
