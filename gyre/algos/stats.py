"""Masked reductions shared by the losses and metrics."""

from __future__ import annotations

import torch


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is 1. Shapes broadcast; returns a 0-dim tensor."""
    return (values * mask).sum()


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is 1; 0 when the mask is empty (never NaN)."""
    count = mask.sum()
    return masked_sum(values, mask) / count.clamp(min=1)
