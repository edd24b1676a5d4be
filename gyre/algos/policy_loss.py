"""Per-token policy-gradient losses (ROLL ``pg_variant``; reference ``algorithms.md`` section 5).

Every variant returns a :class:`PolicyLossOutput` whose ``token_loss`` [B, T] is aggregated afterwards with
``aggregate_loss``, which applies the loss mask. Shapes: B samples, T response tokens; advantages may be any
shape that broadcasts to [B, T] (e.g. [B, 1] outcome advantages). A convenient test view of each variant is the
coefficient c_t multiplying ``-A_t * grad log pi_theta(y_t)``. Old, proximal and behaviour log-probs are
detached inside, and the reported ``ratio`` is always detached.

Papers:

- PPO clip: Schulman et al. (arXiv 1707.06347); separate lower and upper bounds (clip-higher) from DAPO
  (arXiv 2503.14476).
- Dual clip: Ye et al. (arXiv 1912.09729). ``ppo_clip_loss`` has no dual clip unless ``dual_clip_c`` is
  given; the config's default is the paper's c = 3 (presets whose paper has no dual clip turn it off). ROLL
  ties c to ``1 + 2 * pg_clip`` (1.4 at 0.2), which already caps at rho > 1.4.
- GSPO: Zheng et al. (arXiv 2507.18071), in its GSPO-token form ``s_it = sg(s_i) * pi/sg(pi)``. Deviation: the
  paper's sequence loss averages tokens within a sequence; here each token carries ``-s_i * A_it``, which equals
  GSPO with ``seq-mean-token-mean`` aggregation and is length-weighted under ``token-mean``.
- TIS as a loss: ROLL ``pg_variant: tis`` (no paper); not the train-inference weight of ``gyre.algos.mismatch``.
- TOPR: Le Roux et al. (arXiv 2503.14286). Deviation (as ROLL): the negative-set ratio is truncated per token,
  not per trajectory.
- CISPO: MiniMax-M1 (arXiv 2506.13585); ROLL's docstring cites 2503.14286, which is TOPR's number.
- Kimi k1.5 (arXiv 2501.12599).
- Decoupled PPO: Hilton et al. (arXiv 2110.00641); AReaL (arXiv 2505.24298).
- Clip-Cov and KL-Cov (arXiv 2505.22617), GMPO (arXiv 2507.20673), SAPO (arXiv 2511.20347): in
  ``gyre.algos.loss_variants``.

The table of the losses by config name, with each variant's knobs, is the torch-free
``gyre.algos.loss_table.POLICY_LOSSES``, whose functions call these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from gyre.algos.loss_output import PolicyLossOutput
from gyre.algos.loss_output import flag as _flag
from gyre.algos.loss_output import zeros as _zeros
from gyre.algos.loss_table import RatioLevel
from gyre.algos.stats import where_valid


def sequence_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked mean over t of ``log_ratio`` per row (GSPO's length-normalised log-ratio).

    Args:
        log_ratio: [B, T]; off-mask entries may hold anything (they are selected away, not multiplied).
        mask: [B, T], 1 for response tokens.

    Returns:
        [B, 1]; 0 for rows without valid tokens.
    """
    valid = mask > 0
    total = torch.where(valid, log_ratio, torch.zeros_like(log_ratio)).sum(dim=-1, keepdim=True)
    return total / valid.sum(dim=-1, keepdim=True).clamp(min=1)


def _clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float,
                       dual_clip_c: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``min(rho A, clip(rho) A)``, dual-clipped for A < 0; returns (surrogate, low flag, high flag), [B, T]."""
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    surrogate = torch.minimum(ratio * advantages, clipped)
    r = ratio.detach()
    negative = advantages < 0
    low = (r < 1.0 - clip_low) & negative
    high = (r > 1.0 + clip_high) & (advantages > 0)
    if dual_clip_c is not None:
        # For A < 0 the clipped objective is max(rho, 1 - eps_low) * A, unbounded below as rho grows; the cap
        # c * A binds exactly when rho > c (c > 1). Like the upper clip it is a "ratio too high" case.
        surrogate = torch.where(negative, torch.maximum(surrogate, dual_clip_c * advantages), surrogate)
        high = high | (negative & (r > dual_clip_c))
    return surrogate, _flag(low, surrogate), _flag(high, surrogate)


def ppo_clip_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                  clip_low: float = 0.2, clip_high: float = 0.2, dual_clip_c: float | None = None,
                  ratio_level: RatioLevel = "token", mask: torch.Tensor | None = None) -> PolicyLossOutput:
    """PPO clipped surrogate per token, with optional dual clip and GSPO sequence ratio.

    ``l_t = -min(rho_t A_t, clip(rho_t, 1 - clip_low, 1 + clip_high) A_t)``; with ``dual_clip_c`` and A < 0,
    ``l_t = -max(min(...), c A_t)``, i.e. the loss is capped at ``c |A_t|`` and the gradient is 0 beyond it.

    Args:
        logprobs: [B, T] log pi_theta of the sampled tokens (with gradient).
        old_logprobs: [B, T] log pi_old of the same tokens (detached here).
        advantages: broadcastable to [B, T].
        clip_low, clip_high: eps_low and eps_high of the trust region.
        dual_clip_c: dual-clip cap c (> 1), or None for no dual clip.
        ratio_level: "token" (PPO) or "sequence" (GSPO-token: every token's ratio is the sequence ratio
            ``s_i = exp(masked mean_t(logp - old))`` in value, and its gradient w.r.t. its own log-prob is s_i).
        mask: [B, T] loss mask; required for "sequence". When given, ``token_loss`` and the clip flags are 0
            off mask, and off-mask inputs (NaN, inf) reach neither the loss nor the gradient.
    """
    if dual_clip_c is not None and dual_clip_c <= 1.0:
        raise ValueError(f"dual_clip_c must be > 1 (got {dual_clip_c}); c <= 1 would cap inside the trust region")
    if mask is not None:
        # Selected before exp and the products: a NaN there would turn the zero gradient into 0 * NaN.
        logprobs, old_logprobs = where_valid(logprobs, mask), where_valid(old_logprobs, mask)
        advantages = where_valid(advantages, mask)
    log_ratio = logprobs - old_logprobs.detach()
    if ratio_level == "token":
        ratio = torch.exp(log_ratio)
    elif ratio_level == "sequence":
        if mask is None:
            raise ValueError("ratio_level='sequence' (GSPO) needs the loss mask to average the log-ratio")
        seq = sequence_log_ratio(log_ratio.detach(), mask)
        # logprobs - sg(logprobs) is 0 in value but carries d/dlogp_t = 1, so d ratio_t / d logp_t = s_i.
        ratio = torch.exp(seq + logprobs - logprobs.detach())
    else:
        raise ValueError(f"unknown ratio_level {ratio_level!r}; use 'token' or 'sequence'")
    surrogate, low, high = _clipped_surrogate(ratio, advantages, clip_low, clip_high, dual_clip_c)
    token_loss = -surrogate
    if mask is not None:
        token_loss, low, high = where_valid(token_loss, mask), where_valid(low, mask), where_valid(high, mask)
    return PolicyLossOutput(token_loss=token_loss, ratio=ratio.detach().expand_as(token_loss),
                            clipped_low=low, clipped_high=high)


def vanilla_pg_loss(logprobs: torch.Tensor, advantages: torch.Tensor) -> PolicyLossOutput:
    """REINFORCE, ``l_t = -A_t log pi_theta`` (c_t = 1); correct only for on-policy data.

    Args:
        logprobs: [B, T] with gradient. advantages: broadcastable to [B, T].
    """
    token_loss = -(advantages * logprobs)
    return PolicyLossOutput(token_loss=token_loss, ratio=torch.ones_like(token_loss).detach(),
                            clipped_low=_zeros(token_loss), clipped_high=_zeros(token_loss))


def _weighted_pg(logprobs: torch.Tensor, advantages: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``-sg(weight) A log pi_theta``: the IS-weight family (TIS, TOPR, CISPO); c_t = weight."""
    return -(weight.detach() * advantages * logprobs)


def tis_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
             lower: float = 0.0, upper: float = 1.0) -> PolicyLossOutput:
    """Truncated-IS policy gradient, ``l_t = -sg(clip(rho_t, lower, upper)) A_t log pi_theta`` (ROLL ``tis``).

    With the defaults c_t = min(rho, 1): high-ratio tokens are down-weighted, never zeroed.

    Args:
        logprobs, old_logprobs: [B, T]. advantages: broadcastable to [B, T].
        lower, upper: ROLL ``tis_lower_bound`` / ``tis_upper_bound``.
    """
    ratio = torch.exp(logprobs.detach() - old_logprobs.detach())
    token_loss = _weighted_pg(logprobs, advantages, torch.clamp(ratio, lower, upper))
    return PolicyLossOutput(token_loss=token_loss, ratio=ratio.expand_as(token_loss),
                            clipped_low=_flag(ratio < lower, token_loss), clipped_high=_flag(ratio > upper, token_loss))


def topr_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, positive: torch.Tensor,
              positive_weight: float = 1.0, negative_weight: float = 1.0) -> PolicyLossOutput:
    """Tapered off-policy REINFORCE: no IS on positive sequences, truncated IS on the rest.

    T+ (``positive``): ``l_t = -w+ A_t log pi_theta``; T-: ``l_t = -w- sg(clip(rho_t, 0, 1)) A_t log pi_theta``.

    Args:
        logprobs, old_logprobs: [B, T]. advantages: broadcastable to [B, T].
        positive: [B] or [B, 1] bool, True where the sequence reward is > 0.
        positive_weight, negative_weight: ROLL ``topr_positive_weight`` / ``topr_negative_weight``.

    ``ratio`` reports the token ratio everywhere (T+ ignores it); ``clipped_high`` flags T- tokens with rho > 1.
    """
    ratio = torch.exp(logprobs.detach() - old_logprobs.detach())
    pos = positive.reshape(-1, 1).bool()
    weight = torch.where(pos, torch.full_like(ratio, positive_weight), negative_weight * ratio.clamp(max=1.0))
    token_loss = _weighted_pg(logprobs, advantages, weight)
    return PolicyLossOutput(token_loss=token_loss, ratio=ratio.expand_as(token_loss),
                            clipped_low=_zeros(token_loss), clipped_high=_flag(~pos & (ratio > 1.0), token_loss))


def cispo_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, eps_low: float = 0.1,
               eps_high: float = 0.1, unified_mask: bool = False) -> PolicyLossOutput:
    """CISPO, ``l_t = -sg(clip(rho_t, 1 - eps_low, 1 + eps_high)) A_t log pi_theta``.

    Unlike PPO every token keeps a gradient. ``unified_mask`` (ROLL ``cispo_use_unified_mask``) adds PPO's
    trust-region mask on top: tokens with (A > 0 and rho > 1 + eps_high) or (A < 0 and rho < 1 - eps_low) get
    loss 0 and are flagged in ``dropped``.

    Args:
        logprobs, old_logprobs: [B, T]. advantages: broadcastable to [B, T].
        eps_low, eps_high: ROLL ``cispo_epsilon_low`` / ``cispo_epsilon_high``.

    ``clipped_low`` / ``clipped_high`` flag where the weight's clip is active, whatever the sign of A.
    """
    ratio = torch.exp(logprobs.detach() - old_logprobs.detach())
    token_loss = _weighted_pg(logprobs, advantages, torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high))
    dropped = None
    if unified_mask:
        drop = ((advantages > 0) & (ratio > 1.0 + eps_high)) | ((advantages < 0) & (ratio < 1.0 - eps_low))
        dropped = _flag(drop, token_loss)
        token_loss = torch.where(dropped > 0, torch.zeros_like(token_loss), token_loss)
    return PolicyLossOutput(token_loss=token_loss, ratio=ratio.expand_as(token_loss),
                            clipped_low=_flag(ratio < 1.0 - eps_low, token_loss),
                            clipped_high=_flag(ratio > 1.0 + eps_high, token_loss), dropped=dropped)


def kimi15_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                tau: float = 0.1) -> PolicyLossOutput:
    """Kimi k1.5, ``l_t = -A_t log pi_theta + (tau / 2) (log pi_theta - log pi_old)^2``.

    The squared log-ratio is the mirror-descent proximity term; its gradient is ``tau * log_ratio``, so
    c_t = 1 - tau * log_ratio / A_t.

    Args:
        logprobs, old_logprobs: [B, T]. advantages: broadcastable to [B, T]. tau: ROLL ``kimi15_tau``.
    """
    log_ratio = logprobs - old_logprobs.detach()
    token_loss = -(advantages * logprobs) + 0.5 * tau * log_ratio.square()
    return PolicyLossOutput(token_loss=token_loss, ratio=torch.exp(log_ratio.detach()).expand_as(token_loss),
                            clipped_low=_zeros(token_loss), clipped_high=_zeros(token_loss))


def decoupled_ppo_loss(logprobs: torch.Tensor, proximal_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor,
                       advantages: torch.Tensor, clip_low: float = 0.2, clip_high: float = 0.2,
                       behaviour_cap: float | None = None) -> PolicyLossOutput:
    """Decoupled PPO, ``l_t = -sg(pi_prox / mu) min(r_t A_t, clip(r_t) A_t)`` with ``r_t = pi_theta / pi_prox``.

    The trust region is centred on the proximal policy (the weights just before this update), while the
    behaviour weight corrects for the stale policy mu that sampled the tokens.

    Args:
        logprobs: [B, T] log pi_theta (with gradient).
        proximal_logprobs: [B, T] log pi_prox, recomputed by the trainer (detached here).
        behaviour_logprobs: [B, T] log mu, from the sampler (detached here).
        advantages: broadcastable to [B, T].
        clip_low, clip_high: trust region around pi_prox.
        behaviour_cap: upper bound (> 0) on pi_prox / mu (truncated IS), or None for no truncation.

    ``ratio`` and the clip flags are those of r; c_t = (pi_prox / mu) * r inside the trust region, 0 outside.
    """
    if behaviour_cap is not None and behaviour_cap <= 0:
        raise ValueError(f"behaviour_cap must be > 0 (got {behaviour_cap})")
    log_weight = proximal_logprobs.detach() - behaviour_logprobs.detach()
    if behaviour_cap is not None:
        # Cap in log space so a very stale token cannot overflow exp before the min.
        log_weight = log_weight.clamp(max=math.log(behaviour_cap))
    inner = ppo_clip_loss(logprobs, proximal_logprobs, advantages, clip_low, clip_high)
    token_loss = torch.exp(log_weight) * inner.token_loss
    return PolicyLossOutput(token_loss=token_loss, ratio=inner.ratio, clipped_low=inner.clipped_low,
                            clipped_high=inner.clipped_high)


# ---- what the table's functions take ---------------------------------------------------------------


@dataclass
class PolicyLossInputs:
    """What a policy loss may read: [B, T] tensors on the log-probs' device unless noted."""

    logprobs: torch.Tensor
    """log pi_theta of the sampled tokens (with gradient)."""
    old_logprobs: torch.Tensor
    """log pi_old (the proximal policy of decoupled PPO)."""
    advantages: torch.Tensor
    """Broadcastable to [B, T]."""
    mask: torch.Tensor
    """The loss mask, 1 for tokens that train."""
    behaviour_logprobs: torch.Tensor
    """log mu, the sampler's log-probs."""
    scores: torch.Tensor | None
    """[B] outcome reward of each sample (TOPR splits on its sign), or None when the batch has none."""

    def on_mask(self) -> PolicyLossInputs:
        """These inputs with every off-mask entry of the per-token tensors replaced by 0 (selected, not
        multiplied): NaN or inf in padding then reaches neither a variant's loss nor its gradient, whatever
        the variant does with it (``NaN * 0`` is NaN; ``where``'s gradient off the mask is exactly 0)."""
        valid = self.mask > 0
        return replace(self, logprobs=where_valid(self.logprobs, valid),
                       old_logprobs=where_valid(self.old_logprobs, valid),
                       advantages=where_valid(self.advantages, valid),
                       behaviour_logprobs=where_valid(self.behaviour_logprobs, valid))
