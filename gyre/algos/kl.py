"""KL regularisation: per-token estimators, the KL reward penalty and the adaptive coefficient.

Estimators from Schulman, "Approximating KL Divergence" (2020). With ``d = logp - logp_ref`` and tokens drawn
from the policy: k1 = d (unbiased, can be negative), abs = |d| (ROLL ``abs``), k2 = d^2 / 2 (biased, low
variance; ROLL ``mse``), k3 = exp(-d) - 1 + d (unbiased, always >= 0; GRPO's KL loss).

Straight-through estimators (``kl_straight_through``): the value of one estimator with the gradient of
another, ``v + g - sg(g)``. Schulman's blog notes that k1 and k3 are unbiased in value but their gradients are
not the gradient of KL in expectation, while k2's is (d/dtheta of E[k2] = E[d log pi * d]); verl's "k1+" /
"k3+" loss types are k1 / k3 in value with k2's gradient.

Reward penalty ``r_t <- r_t - coef * KL_t`` (PPO / REINFORCE++ style, ROLL ``add_token_level_kl``).
Adaptive coefficient: Ziegler et al., "Fine-Tuning Language Models from Human Preferences" (arXiv 1909.08593),
``e = clip(KL_obs / KL_target - 1, -0.2, 0.2)``, ``coef <- coef * (1 + e * n_steps / horizon)``.
ROLL's ``full`` estimator is not implemented (its semantics are undocumented).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

KLKind = Literal["k1", "abs", "k2", "k3"]


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: KLKind = "k3") -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate, same shape as the inputs."""
    d = logprobs - ref_logprobs
    if kind == "k1":
        return d
    if kind == "abs":
        return d.abs()
    if kind == "k2":
        return 0.5 * d.square()
    if kind == "k3":
        # exp(-d) is computed in a clamped range: one outlier token must not overflow to inf.
        return torch.exp(torch.clamp(-d, max=20.0)) - 1.0 + d
    raise ValueError(f"unknown KL estimator {kind!r}; use k1, abs, k2 or k3")


def kl_straight_through(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, value: KLKind = "k3",
                        grad: KLKind | None = "k2") -> torch.Tensor:
    """Per-token KL estimate with the value of estimator ``value`` and the gradient of ``grad``.

    ``v + g - sg(g)`` in value is v (g - sg(g) is exactly 0) and in gradient is g's; ``grad`` None (or equal to
    ``value``) is the plain ``kl_estimate``.

    Args:
        logprobs: [B, T] log pi_theta of the sampled tokens (with gradient).
        ref_logprobs: [B, T] reference log-probs.
        value, grad: estimator names (k1, abs, k2, k3).
    """
    shown = kl_estimate(logprobs, ref_logprobs, value)
    if grad is None or grad == value:
        return shown
    steer = kl_estimate(logprobs, ref_logprobs, grad)
    return shown.detach() + steer - steer.detach()


def kl_penalized_rewards(token_rewards: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
                         mask: torch.Tensor, coef: float, kind: KLKind = "k1") -> tuple[torch.Tensor, torch.Tensor]:
    """Subtract a per-token KL penalty from the token rewards.

    Args:
        token_rewards: [B, T] rewards (outcome on the last token).
        logprobs: [B, T] log-probs of the sampled tokens under the policy that generated them (no gradient).
        ref_logprobs: [B, T] log-probs under the reference model.
        mask: [B, T] 1 for response tokens.
        coef: penalty coefficient beta.
        kind: estimator; k1 is the usual choice for a reward penalty.

    Returns:
        (penalised rewards [B, T] = r - coef * KL on mask and r unchanged off it, per-token KL [B, T], 0 off-mask).
    """
    valid = mask > 0
    kl = kl_estimate(logprobs.detach(), ref_logprobs.detach(), kind)
    # torch.where, not a product: padded positions may hold -inf log-probs, and inf * 0 is NaN.
    kl = torch.where(valid, kl, torch.zeros_like(kl))
    return token_rewards - coef * kl, kl


@dataclass
class AdaptiveKLController:
    """KL coefficient that tracks a target KL (fixed when ``target`` is None)."""

    coef: float
    target: float | None = None
    horizon: int = 10000

    def __post_init__(self) -> None:
        if self.target is not None and self.target <= 0:
            raise ValueError(f"target KL must be positive or None, got {self.target}")
        if self.horizon <= 0:
            raise ValueError(f"horizon must be positive, got {self.horizon}")

    def update(self, observed_kl: float, n_steps: int) -> None:
        """Move ``coef`` towards the target after ``n_steps`` samples (or tokens) with mean KL ``observed_kl``."""
        if self.target is None:
            return
        # The proportional error is clipped so one noisy estimate moves coef by at most 20% of n_steps/horizon.
        error = min(max(observed_kl / self.target - 1.0, -0.2), 0.2)
        self.coef *= 1.0 + error * n_steps / self.horizon

    def to_dict(self) -> dict[str, float | int | None]:
        return {"coef": self.coef, "target": self.target, "horizon": self.horizon}

    @classmethod
    def from_dict(cls, d: dict) -> AdaptiveKLController:
        target = d.get("target")
        return cls(coef=float(d["coef"]), target=None if target is None else float(target),
                   horizon=int(d.get("horizon", 10000)))
