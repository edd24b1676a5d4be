"""KL regularisation: per-token estimators, the KL reward penalty and the adaptive coefficient.

Estimators from Schulman, "Approximating KL Divergence" (2020). With ``d = logp - logp_ref`` and tokens drawn
from the policy: k1 = d (unbiased, can be negative), abs = |d| (ROLL ``abs``), k2 = d^2 / 2 (biased, low
variance; ROLL ``mse``), k3 = exp(-d) - 1 + d (unbiased, always >= 0; GRPO's KL loss).

Numerics and bound. k3 is computed as ``expm1(-d) + d`` (no cancellation of the 1 near d = 0), and every
estimate is clamped to ``[-clamp, clamp]`` (``KL_CLAMP`` = 10 by default, the bound verl's ``low_var_kl``
puts on k3; the config's ``algorithm.kl.clamp``). Inside the bound the gradient is the exact formula's
(d/dd k3 = 1 - exp(-d): the sign of d, pulling towards the reference); beyond it the gradient is 0, never of
the wrong sign. Before the bound existed the exponent was clamped at 20 instead: below d = -20 the value
was a constant plus d, whose gradient +1 pushed the token further from the reference, and between -20 and
the bound (k3 = 10 near d = -2.6) value and gradient grew to e^20. ``clamp=None`` keeps the exact
estimate, which overflows to inf below d of about -88 in float32.

Straight-through estimators (``kl_straight_through``): the value of one estimator with the gradient of
another, ``v + g - sg(g)``. Used as a loss on tokens sampled from pi, the estimators' gradients differ from
their values' meaning: k2's, ``d * grad log pi``, is the gradient of KL(pi || pi_ref) in expectation, while
k1's has expectation 0 and k3's, ``(1 - pi_ref / pi) grad log pi``, is that of KL(pi_ref || pi). verl's "k1+"
/ "k3+" loss types (``kl_penalty`` in its core_algos) are k1 / k3 in value with k2's gradient.

Reward penalty ``r_t <- r_t - coef * KL_t`` (PPO / REINFORCE++ style, ROLL ``add_token_level_kl``).
Adaptive coefficient: Ziegler et al., "Fine-Tuning Language Models from Human Preferences" (arXiv 1909.08593),
``e = clip(KL_obs / KL_target - 1, -0.2, 0.2)``, ``coef <- coef * (1 + e * n_steps / horizon)``.
ROLL's ``full`` estimator is not implemented (its semantics are undocumented).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gyre.algos.specs import KL_CLAMP, KLKind


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: KLKind = "k3",
                clamp: float | None = KL_CLAMP) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate, same shape as the inputs (float32 at least).

    Args:
        logprobs, ref_logprobs: log-probs of the sampled tokens under the policy and the reference.
        kind: the estimator (module docstring).
        clamp: the estimate is clamped to [-clamp, clamp], where its gradient becomes 0; None: exact.
    """
    d = logprobs - ref_logprobs
    if d.element_size() < 4:  # half precision would overflow exp(-d) long before the clamp binds
        d = d.float()
    if kind == "k1":
        kl = d
    elif kind == "abs":
        kl = d.abs()
    elif kind == "k2":
        kl = 0.5 * d.square()
    elif kind == "k3":
        kl = _k3(d, clamp)
    else:
        raise ValueError(f"unknown KL estimator {kind!r}; use k1, abs, k2 or k3")
    return kl if clamp is None else kl.clamp(-clamp, clamp)


def _k3(d: torch.Tensor, clamp: float | None) -> torch.Tensor:
    """``exp(-d) - 1 + d``. With a clamp c, d is first floored at -(c + 1) (at most -80): k3 there already
    exceeds c (e^x - 1 - x > x - 1 for x = c + 1), so the clamped value is unchanged, while exp stays finite
    and the floored tokens get the gradient 0 that the clamp gives them anyway (never inf * 0 = NaN)."""
    if clamp is not None:
        d = d.clamp(min=-min(clamp + 1.0, 80.0))
    return torch.expm1(-d) + d


def kl_straight_through(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, value: KLKind = "k3",
                        grad: KLKind | None = "k2", clamp: float | None = KL_CLAMP) -> torch.Tensor:
    """Per-token KL estimate with the value of estimator ``value`` and the gradient of ``grad``.

    ``v + g - sg(g)`` in value is v (g - sg(g) is exactly 0) and in gradient is g's; ``grad`` None (or equal to
    ``value``) is the plain ``kl_estimate``. Both estimates are clamped by ``clamp`` (``kl_estimate``): a token
    whose ``grad`` estimate is beyond the bound gets gradient 0.

    Args:
        logprobs: [B, T] log pi_theta of the sampled tokens (with gradient).
        ref_logprobs: [B, T] reference log-probs.
        value, grad: estimator names (k1, abs, k2, k3).
        clamp: the bound of both estimates; None: exact.
    """
    shown = kl_estimate(logprobs, ref_logprobs, value, clamp)
    if grad is None or grad == value:
        return shown
    steer = kl_estimate(logprobs, ref_logprobs, grad, clamp)
    return shown.detach() + steer - steer.detach()


def kl_penalized_rewards(token_rewards: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
                         mask: torch.Tensor, coef: float, kind: KLKind = "k1",
                         clamp: float | None = KL_CLAMP) -> tuple[torch.Tensor, torch.Tensor]:
    """Subtract a per-token KL penalty from the token rewards.

    Args:
        token_rewards: [B, T] rewards (outcome on the last token).
        logprobs: [B, T] log-probs of the sampled tokens under the policy that generated them (no gradient).
        ref_logprobs: [B, T] log-probs under the reference model.
        mask: [B, T] 1 for response tokens.
        coef: penalty coefficient beta.
        kind: estimator; k1 is the usual choice for a reward penalty.
        clamp: bound of the per-token estimate (``kl_estimate``).

    Returns:
        (penalised rewards [B, T] = r - coef * KL on mask and r unchanged off it, per-token KL [B, T], 0 off-mask).
    """
    valid = mask > 0
    kl = kl_estimate(logprobs.detach(), ref_logprobs.detach(), kind, clamp)
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
