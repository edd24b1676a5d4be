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
  ``gyre.algos.loss_variants``, listed in the table below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal, Protocol

import torch

from gyre.algos.aggregation import AggMode
from gyre.algos.kl import KL_CLAMP, KLKind
from gyre.algos.loss_output import PolicyLossOutput
from gyre.algos.loss_output import flag as _flag
from gyre.algos.loss_output import zeros as _zeros
from gyre.algos.loss_variants import clip_cov_loss, gmpo_loss, kl_cov_loss, sapo_loss
from gyre.algos.stats import where_valid
from gyre.algos.tables import Registry, knob, run_field

RatioLevel = Literal["token", "sequence"]


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


# ---- selection by name ----------------------------------------------------------------------------


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


class PolicyLossFn(Protocol):
    """The one signature of every registered loss: the inputs, and the spec for the variant's knobs."""

    def __call__(self, x: PolicyLossInputs, s: PolicyLossSpec) -> PolicyLossOutput: ...


@dataclass(frozen=True)
class PolicyLossVariant:
    """One row of ``POLICY_LOSSES``: the loss and what the config must know about it."""

    loss: PolicyLossFn
    sequence_ratio: bool = False
    """Honours ``ratio_level="sequence"`` (GSPO); the config refuses that level for the others."""
    uses_behaviour: bool = False
    """Compares the trainer's pi_old with the sampler's log-probs, so pi_old must be recomputed."""
    has_ratio: bool = True
    """False for a loss without importance ratio: correct only on-policy (the config warns otherwise)."""
    knobs: tuple[str, ...] = ()
    """The ``PolicyLossSpec`` fields it reads besides the shared ones (``gyre check`` shows their values)."""


def _ppo(x: PolicyLossInputs, s: PolicyLossSpec) -> PolicyLossOutput:
    return ppo_clip_loss(x.logprobs, x.old_logprobs, x.advantages, s.clip_low, s.clip_high, s.dual_clip_c,
                         s.ratio_level, x.mask)


def _vanilla(x: PolicyLossInputs, s: PolicyLossSpec) -> PolicyLossOutput:
    return vanilla_pg_loss(x.logprobs, x.advantages)


def _tis(x: PolicyLossInputs, s: PolicyLossSpec) -> PolicyLossOutput:
    return tis_loss(x.logprobs, x.old_logprobs, x.advantages, s.tis_low, s.tis_high)


def _topr(x: PolicyLossInputs, s: PolicyLossSpec) -> PolicyLossOutput:
    if x.scores is None:
        raise ValueError("policy_loss topr needs batch.scores (the outcome reward of each sample)")
    return topr_loss(x.logprobs, x.old_logprobs, x.advantages, (x.scores > 0)[:, None], s.topr_positive_weight,
                     s.topr_negative_weight)


def _cispo(x: PolicyLossInputs, s: PolicyLossSpec) -> PolicyLossOutput:
    return cispo_loss(x.logprobs, x.old_logprobs, x.advantages, s.cispo_low, s.cispo_high, s.cispo_unified_mask)


def _kimi15(x: PolicyLossInputs, s: PolicyLossSpec) -> PolicyLossOutput:
    return kimi15_loss(x.logprobs, x.old_logprobs, x.advantages, s.kimi15_tau)


def _decoupled_ppo(x: PolicyLossInputs, s: PolicyLossSpec) -> PolicyLossOutput:
    return decoupled_ppo_loss(x.logprobs, x.old_logprobs, x.behaviour_logprobs, x.advantages, s.clip_low,
                              s.clip_high, s.behaviour_cap)


def _clip_cov(x: PolicyLossInputs, s: PolicyLossSpec) -> PolicyLossOutput:
    return clip_cov_loss(x.logprobs, x.old_logprobs, x.advantages, x.mask, s.clip_low, s.clip_high, s.clip_cov_ratio,
                         s.clip_cov_lb, s.clip_cov_ub)


def _kl_cov(x: PolicyLossInputs, s: PolicyLossSpec) -> PolicyLossOutput:
    return kl_cov_loss(x.logprobs, x.old_logprobs, x.advantages, x.mask, s.kl_cov_ratio, s.kl_cov_coef)


def _gmpo(x: PolicyLossInputs, s: PolicyLossSpec) -> PolicyLossOutput:
    return gmpo_loss(x.logprobs, x.old_logprobs, x.advantages, x.mask, s.gmpo_clip_low, s.gmpo_clip_high)


def _sapo(x: PolicyLossInputs, s: PolicyLossSpec) -> PolicyLossOutput:
    return sapo_loss(x.logprobs, x.old_logprobs, x.advantages, x.mask, s.sapo_tau_pos, s.sapo_tau_neg)


_CLIP = ("clip_low", "clip_high")

POLICY_LOSSES: Registry[PolicyLossVariant] = Registry("policy loss", {
    "ppo": PolicyLossVariant(_ppo, sequence_ratio=True, knobs=(*_CLIP, "dual_clip_c")),
    "vanilla": PolicyLossVariant(_vanilla, has_ratio=False),
    "tis": PolicyLossVariant(_tis, knobs=("tis_low", "tis_high")),
    "topr": PolicyLossVariant(_topr, knobs=("topr_positive_weight", "topr_negative_weight")),
    "cispo": PolicyLossVariant(_cispo, knobs=("cispo_low", "cispo_high", "cispo_unified_mask")),
    "kimi15": PolicyLossVariant(_kimi15, knobs=("kimi15_tau",)),
    "decoupled_ppo": PolicyLossVariant(_decoupled_ppo, uses_behaviour=True, knobs=(*_CLIP, "behaviour_cap")),
    "clip_cov": PolicyLossVariant(_clip_cov, knobs=(*_CLIP, "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub")),
    "kl_cov": PolicyLossVariant(_kl_cov, knobs=("kl_cov_ratio", "kl_cov_coef")),
    "gmpo": PolicyLossVariant(_gmpo, knobs=("gmpo_clip_low", "gmpo_clip_high")),
    "sapo": PolicyLossVariant(_sapo, knobs=("sapo_tau_pos", "sapo_tau_neg")),
})
"""The policy losses by config name (``algorithm.policy_loss``). A new loss is a function above, an
adapter ``(PolicyLossInputs, PolicyLossSpec) -> PolicyLossOutput`` and a row here (plus a ``knob`` in
``PolicyLossSpec`` for each new parameter); the config accepts the name from this table."""

OldSource = Literal["recomputed", "rollout", "current"]


@dataclass(frozen=True)
class PolicyLossSpec:
    """The policy loss's variant and knobs: everything the step loss needs besides the batch.

    Declared once, here: the config's ``algorithm`` section takes its loss keys from these fields
    (names, types, defaults and bounds; ``gyre.config.schema.PolicyLossKnobs``) and builds the spec from
    them by name (``AlgorithmConfig.loss_spec``); ``run_field`` fields are filled in by the driver. A plain
    frozen record, it pickles cheaply to every trainer rank, which looks the variant up in
    ``POLICY_LOSSES`` once, when it builds the loss.
    """

    policy_loss: str = knob("ppo", choices=POLICY_LOSSES)
    """The variant: a name of ``POLICY_LOSSES``."""
    ratio_level: RatioLevel = "token"
    """sequence: GSPO's length-normalised sequence ratio (ppo loss only)."""
    clip_low: float = knob(0.2, ge=0, le=1)
    """eps_low of the trust region (ppo, decoupled_ppo, clip_cov); 1 leaves the ratio unbounded below (Clip-Cov's
    recipe)."""
    clip_high: float = knob(0.2, ge=0)
    """eps_high of the trust region (ppo, decoupled_ppo); DAPO's clip-higher raises it."""
    dual_clip_c: float | None = knob(3.0, gt=1)
    """Dual clip of the ppo loss for negative advantages (arXiv 1912.09729): the loss is capped at c * |A|.
    An independent constant (ROLL ties it to 1 + 2 * clip, 1.4, far tighter); None turns it off."""
    tis_low: float = knob(0.0, ge=0)
    """tis: lower truncation of the ratio weight."""
    tis_high: float = knob(1.0, gt=0)
    """tis: upper truncation of the ratio weight."""
    topr_positive_weight: float = knob(1.0, ge=0)
    """topr: weight of the samples with a positive reward (no importance ratio)."""
    topr_negative_weight: float = knob(1.0, ge=0)
    """topr: weight of the other samples (ratio truncated at 1)."""
    cispo_low: float = knob(0.1, ge=0)
    """cispo: the weight is clipped from below at 1 - cispo_low."""
    cispo_high: float = knob(0.1, ge=0)
    """cispo: the weight is clipped from above at 1 + cispo_high."""
    cispo_unified_mask: bool = False
    """cispo: add PPO's trust-region mask (ROLL ``cispo_use_unified_mask``)."""
    kimi15_tau: float = knob(0.1, ge=0)
    """kimi15: weight of the squared log-ratio proximity term."""
    behaviour_cap: float | None = knob(None, gt=0)
    """decoupled_ppo: truncate the weight pi_prox / mu at this value."""
    clip_cov_ratio: float = knob(2e-4, gt=0, le=1)
    """clip_cov: share r of the valid tokens detached, drawn among those whose covariance of log-prob and
    advantage lies in (clip_cov_lb, clip_cov_ub) (verl's name; the authors' 2e-4)."""
    clip_cov_lb: float = 1.0
    """clip_cov: lower end omega_low of the covariance band (the authors' 1)."""
    clip_cov_ub: float = 5.0
    """clip_cov: upper end omega_high of the covariance band (the authors' 5)."""
    kl_cov_ratio: float = knob(2e-3, gt=0, le=1)
    """kl_cov: share k of the valid tokens, those of largest covariance, that get the KL penalty (the
    authors' 2e-3 for 7B models, 2e-4 for 32B; verl's name, whose default is 2e-4)."""
    kl_cov_coef: float = knob(1.0, ge=0)
    """kl_cov: weight beta of the penalty |log pi_theta - log pi_old| (verl's ppo_kl_coef; the authors' 1)."""
    gmpo_clip_low: float = knob(0.4, ge=0)
    """gmpo: the token log-ratio is clipped from below at -gmpo_clip_low (the paper's 0.4: ratio e^-0.4)."""
    gmpo_clip_high: float = knob(0.4, ge=0)
    """gmpo: the token log-ratio is clipped from above at gmpo_clip_high (the paper's 0.4: ratio e^0.4)."""
    sapo_tau_pos: float = knob(1.0, gt=0)
    """sapo: temperature of the soft gate where A > 0 (the paper's 1.0; verl's tau_pos)."""
    sapo_tau_neg: float = knob(1.05, gt=0)
    """sapo: temperature of the soft gate where A <= 0 (the paper's 1.05: negative tokens decay faster)."""
    loss_agg: AggMode = "token-mean"
    """How token losses become the step loss (``gyre.algos.aggregation``)."""
    kl_loss_coef: float = knob(0.0, ge=0)
    """KL-to-reference loss term (GRPO style); > 0 creates the reference role."""
    kl_loss_estimator: KLKind = "k3"
    """The KL estimator of that term (its value)."""
    kl_loss_grad_estimator: KLKind | None = None
    """Straight-through KL: the term keeps kl_loss_estimator's value and takes this estimator's gradient
    (verl's "k1+" / "k3+" are k2 here: the gradient of KL(pi || pi_ref) in expectation); None: the value's
    own."""
    kl_clamp: float | None = knob(KL_CLAMP, gt=0, le=1e6)
    """Every per-token KL estimate, of the KL loss and of the KL reward penalty, any estimator, is clamped
    to [-kl_clamp, kl_clamp] (verl's low_var_kl clamps k3 to [-10, 10]); a clamped token's KL gradient is 0,
    never of the wrong sign. k3 = 10 at log-ratios log pi - log pi_ref of about -2.61 and 11. None keeps
    the exact estimate (k3 then overflows to inf below a log-ratio of about -88 in float32)."""
    entropy_coef: float = knob(0.0, ge=0)
    """Entropy bonus subtracted from the loss."""
    temperature: float = run_field(1.0, "rollout.sampling.temperature")
    """Log-probs are taken at the sampling temperature."""
    old_source: OldSource = run_field("recomputed", "the run plan")
    """Where pi_old comes from: "recomputed" (batch.old_logprobs), "rollout" (the sampler's log-probs) or
    "current" (the detached current log-probs)."""
    distill_loss_coef: float = run_field(0.0, "algorithm.distill_coef under distill_mode loss")
    """Weight of the on-policy distillation loss term 1/2 (log pi_theta - log pi_teacher)^2
    (``gyre.algos.distill``); 0: none."""
