"""Masked reductions, whitening and running moments shared by the estimators, losses and metrics.

Every std follows the library convention ``(x - mean) / (std + eps)`` with a ``ddof`` parameter (1 by default,
torch's convention). ``masked_whiten`` mirrors ROLL's ``whiten_advantages`` (skipped below 2 valid entries);
deviation: ROLL scales by ``rsqrt(var + eps)``, gyre by ``1 / (std + eps)`` like every other std here.
``RunningMoments`` merges batches with Chan et al.'s parallel update of Welford's algorithm, so chunked updates
match the moments of the concatenation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is 1. Shapes broadcast; returns a 0-dim tensor."""
    return (values * mask).sum()


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is 1; 0 when the mask is empty (never NaN)."""
    count = mask.sum()
    return masked_sum(values, mask) / count.clamp(min=1)


def masked_var(values: torch.Tensor, mask: torch.Tensor, ddof: int = 1) -> torch.Tensor:
    """Variance of ``values`` over the entries where ``mask`` is 1.

    Args:
        values: any shape.
        mask: same shape as ``values`` (0/1); off-mask entries must be finite (they are multiplied by 0).
        ddof: 1 for the sample variance, 0 for the population variance.

    Returns:
        0-dim tensor; 0 when there are fewer than ``ddof + 1`` valid entries (never NaN).
    """
    mask = mask.to(values.dtype)
    count = mask.sum()
    mean = masked_sum(values, mask) / count.clamp(min=1)
    sq = masked_sum((values - mean).square(), mask)
    # torch.where instead of a Python branch: no host sync, and the empty case stays 0 instead of NaN.
    return torch.where(count > ddof, sq / (count - ddof).clamp(min=1e-12), torch.zeros_like(sq))


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-6,
                  ddof: int = 1) -> torch.Tensor:
    """Whiten ``values`` with the mean and std of the valid entries (advantage / reward whitening).

    Args:
        values: any shape, e.g. [B, T] advantages.
        mask: same shape, 1 for valid entries.
        shift_mean: False keeps the original mean, ``(x - mean) / (std + eps) + mean`` (rescale only), as ROLL.
        eps: added to the std.
        ddof: std degrees of freedom.

    Returns:
        Same shape; off-mask entries 0. With fewer than 2 valid entries the statistics are meaningless and
        ``values`` is returned unchanged (ROLL skips whitening then).
    """
    mask = mask.to(values.dtype)
    if float(mask.sum()) < 2:
        return values
    mean = masked_mean(values, mask)
    std = masked_var(values, mask, ddof=ddof).sqrt()
    whitened = (values - mean) / (std + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask


@dataclass
class RunningMoments:
    """Running count, mean and sum of squared deviations (``m2``) over every value seen so far.

    Used for the ``running`` normalisation scope; serialise with ``to_dict`` / ``from_dict`` in checkpoints.
    """

    count: float = 0.0
    mean: float = 0.0
    m2: float = 0.0

    def update(self, values: torch.Tensor) -> None:
        """Merge every element of ``values`` (any shape) into the moments; an empty tensor is a no-op."""
        x = values.detach().reshape(-1).to(torch.float64)
        n = x.numel()
        if n == 0:
            return
        batch_mean = float(x.mean())
        batch_m2 = float((x - batch_mean).square().sum())
        total = self.count + n
        delta = batch_mean - self.mean
        # Chan et al. pairwise merge: exact for any chunking, stable when one side is much larger.
        self.mean += delta * n / total
        self.m2 += batch_m2 + delta * delta * self.count * n / total
        self.count = total

    def var(self, ddof: int = 1) -> float:
        """Variance of everything seen; 0.0 with fewer than ``ddof + 1`` values."""
        return self.m2 / (self.count - ddof) if self.count > ddof else 0.0

    def std(self, ddof: int = 1) -> float:
        """Standard deviation of everything seen; 0.0 with fewer than ``ddof + 1`` values."""
        return math.sqrt(max(self.var(ddof), 0.0))

    def to_dict(self) -> dict[str, float]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    @classmethod
    def from_dict(cls, d: dict[str, float]) -> RunningMoments:
        return cls(count=float(d["count"]), mean=float(d["mean"]), m2=float(d["m2"]))
