"""Masked reductions, whitening and running moments shared by the estimators, losses and metrics.

Masks are 0/1 (an entry counts where ``mask > 0``). Every masked reduction *selects* the valid entries
(``torch.where``) instead of multiplying by the mask: padding may hold NaN or inf (a -inf reference
log-prob, a NaN recomputed one), and ``NaN * 0`` is NaN, while ``where`` drops the entry from the value
and gives it an exact zero gradient. ``where_valid`` is that selection for callers.

Every std follows the library convention ``(x - mean) / (std + eps)`` (algorithms.md section 0: every std
carries +eps in its denominator) with a ``ddof`` parameter (1 by default, torch's convention).
``RunningMoments`` merges batches with Chan et al.'s parallel update of Welford's algorithm, so chunked
updates match the moments of the concatenation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def where_valid(values: torch.Tensor, mask: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
    """``values`` where ``mask > 0``, ``fill`` elsewhere (shapes broadcast).

    A selection, not a product: NaN or inf off the mask reaches neither the result nor, through
    autograd, the gradient of ``values`` (where's gradient off the mask is exactly 0).
    """
    return torch.where(mask > 0, values, fill)


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of ``values`` where ``mask > 0``. Shapes broadcast; returns a 0-dim tensor."""
    return where_valid(values, mask).sum()


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` where ``mask > 0``; 0 when the mask is empty (never NaN)."""
    count = torch.broadcast_to(mask > 0, torch.broadcast_shapes(values.shape, mask.shape)).sum()
    return masked_sum(values, mask) / count.clamp(min=1)


def masked_var(values: torch.Tensor, mask: torch.Tensor, ddof: int = 1) -> torch.Tensor:
    """Variance of ``values`` over the entries where ``mask > 0``.

    Args:
        values: any shape; off-mask entries may hold anything (NaN, inf): they are selected away.
        mask: same shape as ``values`` (0/1).
        ddof: 1 for the sample variance, 0 for the population variance.

    Returns:
        0-dim tensor; 0 when there are fewer than ``ddof + 1`` valid entries (never NaN).
    """
    valid = mask > 0
    # Selected first, so the deviations of padding are finite too: their gradient is 0, not 0 * NaN.
    values = where_valid(values, valid)
    count = valid.sum().to(values.dtype)
    mean = values.sum() / count.clamp(min=1)
    sq = masked_sum((values - mean).square(), valid)
    # torch.where instead of a Python branch: no host sync, and the empty case stays 0 instead of NaN.
    return torch.where(count > ddof, sq / (count - ddof).clamp(min=1e-12), torch.zeros_like(sq))


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-6,
                  ddof: int = 1) -> torch.Tensor:
    """Whiten ``values`` with the mean and std of the valid entries (advantage / reward whitening).

    ``(x - mean) / (std + eps)``, the convention of every std in gyre (algorithms.md section 0). ROLL's
    ``whiten_advantages`` and OpenRLHF scale by ``rsqrt(var + eps)`` instead; the two agree while std is
    large against sqrt(eps) and part when it is not (eps = 1e-6, std = 1e-3: a factor 999 here against 707).

    Degenerate cases, explicitly:
    - fewer than 2 valid entries: there is no spread to measure, so the valid entries are returned
      unchanged (not whitened; ROLL skips whitening too);
    - every valid entry equal (zero std): each becomes 0 (their mean with ``shift_mean=False``), whatever
      eps is, instead of rounding noise divided by eps.

    Args:
        values: any shape, e.g. [B, T] advantages; off-mask entries may hold anything.
        mask: same shape, 1 for valid entries.
        shift_mean: False keeps the original mean, ``(x - mean) / (std + eps) + mean`` (rescale only), as ROLL.
        eps: added to the std.
        ddof: std degrees of freedom.

    Returns:
        Same shape; off-mask entries 0 in every case.
    """
    valid = mask > 0
    values = where_valid(values, valid)  # first: every later product and gradient stays finite
    if int(valid.sum()) < 2:
        return values
    mean = masked_mean(values, valid)
    std = masked_var(values, valid, ddof=ddof).sqrt()
    # Equal values are detected exactly (max == min), not by a tolerance on the computed std.
    spread = where_valid(values, valid, -math.inf).max() > where_valid(values, valid, math.inf).min()
    whitened = torch.where(spread, (values - mean) / (std + eps), torch.zeros_like(values))
    if not shift_mean:
        whitened = whitened + mean
    return where_valid(whitened, valid)


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
