"""KL estimators between the policy and a reference, per sampled token.

Schulman, "Approximating KL Divergence" (2020). With ``d = logp - logp_ref`` and tokens drawn from
the policy: k1 = d (unbiased, can be negative), k2 = d^2 / 2 (biased, low variance),
k3 = exp(-d) - 1 + d (unbiased, always >= 0; GRPO's KL loss).
"""

from __future__ import annotations

from typing import Literal

import torch

KLKind = Literal["k1", "k2", "k3"]


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: KLKind = "k3") -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate, same shape as the inputs."""
    d = logprobs - ref_logprobs
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d.square()
    if kind == "k3":
        # exp(-d) is computed in a clamped range: one outlier token must not overflow to inf.
        return torch.exp(torch.clamp(-d, max=20.0)) - 1.0 + d
    raise ValueError(f"unknown KL estimator {kind!r}; use k1, k2 or k3")
