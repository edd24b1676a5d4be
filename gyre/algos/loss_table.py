"""The policy losses by name (``algorithm.loss.variant``): each variant's knobs, its function and its row.

Torch-free, so the config takes its names, capabilities and knobs from here without importing torch. Each
variant is a frozen dataclass of its own knobs (declared with ``knob``: bounds and documentation written
once; the config's ``algorithm.loss.<name>`` section is generated from it), beside the one function every
row calls, ``(PolicyLossInputs, PolicyLossSpec, knobs) -> PolicyLossOutput``, which imports its tensor maths
(``gyre.algos.policy_loss``, ``gyre.algos.loss_variants``, where each loss names its paper) when it first
runs. A new loss is its maths, then here a knobs dataclass, a function and a row in ``POLICY_LOSSES``;
no config file changes.

``PolicyLossSpec`` is what the trainers get: the chosen variant with its knobs, the knobs the variants
share (the clip range, the aggregation, the entropy bonus), the KL loss term and the run's values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from gyre.algos.specs import AggMode, KLSpec
from gyre.algos.tables import Registry, knob, resolve_knobs, run_field, variant_knobs

if TYPE_CHECKING:
    from gyre.algos.loss_output import PolicyLossOutput
    from gyre.algos.policy_loss import PolicyLossInputs

RatioLevel = Literal["token", "sequence"]
OldSource = Literal["recomputed", "rollout", "current"]


class PolicyLossFn(Protocol):
    """The one signature of every registered loss: the inputs, the spec (shared knobs) and the variant's own
    knobs (``spec.knobs``, passed on its own so each function names its type)."""

    def __call__(self, x: PolicyLossInputs, s: PolicyLossSpec, k: Any) -> PolicyLossOutput: ...


@dataclass(frozen=True)
class PpoKnobs:
    """PPO's clipped surrogate (Schulman et al., arXiv 1707.06347; separate bounds, clip-higher, from DAPO,
    arXiv 2503.14476); with loss.ratio_level sequence, GSPO (arXiv 2507.18071). The clip range is the loss
    section's clip_low and clip_high."""

    dual_clip_c: float | None = knob(3.0, gt=1)
    """Dual clip for negative advantages (arXiv 1912.09729): the loss is capped at c * |A|. An independent
    constant (ROLL ties it to 1 + 2 * clip, 1.4, far tighter); None turns it off."""


def _ppo(x: PolicyLossInputs, s: PolicyLossSpec, k: PpoKnobs) -> PolicyLossOutput:
    from gyre.algos.policy_loss import ppo_clip_loss

    return ppo_clip_loss(x.logprobs, x.old_logprobs, x.advantages, s.clip_low, s.clip_high, k.dual_clip_c,
                         s.ratio_level, x.mask)


def _vanilla(x: PolicyLossInputs, s: PolicyLossSpec, k: None) -> PolicyLossOutput:
    from gyre.algos.policy_loss import vanilla_pg_loss

    return vanilla_pg_loss(x.logprobs, x.advantages)


@dataclass(frozen=True)
class TisKnobs:
    """Truncated-IS policy gradient as a loss (ROLL ``pg_variant: tis``, no paper): -sg(clip(rho, low, high))
    A log pi. Not the train-inference weight of algorithm.mismatch."""

    low: float = knob(0.0, ge=0)
    """Lower truncation of the ratio weight."""
    high: float = knob(1.0, gt=0)
    """Upper truncation of the ratio weight."""


def _tis(x: PolicyLossInputs, s: PolicyLossSpec, k: TisKnobs) -> PolicyLossOutput:
    from gyre.algos.policy_loss import tis_loss

    return tis_loss(x.logprobs, x.old_logprobs, x.advantages, k.low, k.high)


@dataclass(frozen=True)
class ToprKnobs:
    """TOPR (Le Roux et al., arXiv 2503.14286): no importance ratio on samples with a positive reward, the
    ratio truncated at 1 on the others."""

    positive_weight: float = knob(1.0, ge=0)
    """Weight of the samples with a positive reward (no importance ratio)."""
    negative_weight: float = knob(1.0, ge=0)
    """Weight of the other samples (ratio truncated at 1)."""


def _topr(x: PolicyLossInputs, s: PolicyLossSpec, k: ToprKnobs) -> PolicyLossOutput:
    from gyre.algos.policy_loss import topr_loss

    if x.scores is None:
        raise ValueError("policy loss topr needs batch.scores (the outcome reward of each sample)")
    return topr_loss(x.logprobs, x.old_logprobs, x.advantages, (x.scores > 0)[:, None], k.positive_weight,
                     k.negative_weight)


@dataclass(frozen=True)
class CispoKnobs:
    """CISPO (MiniMax-M1, arXiv 2506.13585): the clipped, detached ratio weights every token's -A log pi, so
    every token keeps a gradient."""

    low: float = knob(0.1, ge=0)
    """The weight is clipped from below at 1 - low (ROLL cispo_epsilon_low)."""
    high: float = knob(0.1, ge=0)
    """The weight is clipped from above at 1 + high (ROLL cispo_epsilon_high)."""
    unified_mask: bool = False
    """Add PPO's trust-region mask (ROLL ``cispo_use_unified_mask``)."""


def _cispo(x: PolicyLossInputs, s: PolicyLossSpec, k: CispoKnobs) -> PolicyLossOutput:
    from gyre.algos.policy_loss import cispo_loss

    return cispo_loss(x.logprobs, x.old_logprobs, x.advantages, k.low, k.high, k.unified_mask)


@dataclass(frozen=True)
class Kimi15Knobs:
    """Kimi k1.5 (arXiv 2501.12599): -A log pi plus a squared log-ratio proximity term (mirror descent)."""

    tau: float = knob(0.1, ge=0)
    """Weight of the squared log-ratio proximity term (ROLL kimi15_tau)."""


def _kimi15(x: PolicyLossInputs, s: PolicyLossSpec, k: Kimi15Knobs) -> PolicyLossOutput:
    from gyre.algos.policy_loss import kimi15_loss

    return kimi15_loss(x.logprobs, x.old_logprobs, x.advantages, k.tau)


@dataclass(frozen=True)
class DecoupledPpoKnobs:
    """Decoupled PPO (Hilton et al., arXiv 2110.00641; AReaL, arXiv 2505.24298): the trust region (the loss
    section's clip range) around the proximal policy, and a weight pi_prox / mu for the stale sampler."""

    behaviour_cap: float | None = knob(None, gt=0)
    """Truncate the weight pi_prox / mu at this value; None: no truncation."""


def _decoupled_ppo(x: PolicyLossInputs, s: PolicyLossSpec, k: DecoupledPpoKnobs) -> PolicyLossOutput:
    from gyre.algos.policy_loss import decoupled_ppo_loss

    return decoupled_ppo_loss(x.logprobs, x.old_logprobs, x.behaviour_logprobs, x.advantages, s.clip_low,
                              s.clip_high, k.behaviour_cap)


@dataclass(frozen=True)
class ClipCovKnobs:
    """Clip-Cov ("The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617): PPO's clip (the loss
    section's clip range; the authors' recipe opens it to 1), and a random share of the tokens of high
    covariance between log-prob and advantage detached."""

    ratio: float = knob(2e-4, gt=0, le=1)
    """Share r of the valid tokens detached, drawn among those whose covariance of log-prob and advantage
    lies in (lb, ub) (verl's clip_cov_ratio; the authors' 2e-4)."""
    lb: float = 1.0
    """Lower end omega_low of the covariance band (the authors' 1)."""
    ub: float = 5.0
    """Upper end omega_high of the covariance band (the authors' 5)."""

    def __post_init__(self) -> None:
        if self.lb >= self.ub:
            raise ValueError(f"lb={self.lb:g} must be below ub={self.ub:g}: Clip-Cov draws the tokens it detaches "
                             "from the covariances strictly between them")


def _clip_cov(x: PolicyLossInputs, s: PolicyLossSpec, k: ClipCovKnobs) -> PolicyLossOutput:
    from gyre.algos.loss_variants import clip_cov_loss

    return clip_cov_loss(x.logprobs, x.old_logprobs, x.advantages, x.mask, s.clip_low, s.clip_high, k.ratio,
                         k.lb, k.ub)


@dataclass(frozen=True)
class KlCovKnobs:
    """KL-Cov (arXiv 2505.22617): a KL penalty |log pi_theta - log pi_old| on the tokens of largest
    covariance between log-prob and advantage."""

    ratio: float = knob(2e-3, gt=0, le=1)
    """Share k of the valid tokens, those of largest covariance, that get the KL penalty (the authors' 2e-3
    for 7B models, 2e-4 for 32B; verl's kl_cov_ratio, whose default is 2e-4)."""
    coef: float = knob(1.0, ge=0)
    """Weight beta of the penalty |log pi_theta - log pi_old| (verl's ppo_kl_coef; the authors' 1)."""


def _kl_cov(x: PolicyLossInputs, s: PolicyLossSpec, k: KlCovKnobs) -> PolicyLossOutput:
    from gyre.algos.loss_variants import kl_cov_loss

    return kl_cov_loss(x.logprobs, x.old_logprobs, x.advantages, x.mask, k.ratio, k.coef)


@dataclass(frozen=True)
class GmpoKnobs:
    """GMPO (arXiv 2507.20673): the geometric mean of the token objectives, each token's log-ratio clipped."""

    clip_low: float = knob(0.4, ge=0)
    """The token log-ratio is clipped from below at -clip_low (the paper's 0.4: ratio e^-0.4)."""
    clip_high: float = knob(0.4, ge=0)
    """The token log-ratio is clipped from above at clip_high (the paper's 0.4: ratio e^0.4)."""


def _gmpo(x: PolicyLossInputs, s: PolicyLossSpec, k: GmpoKnobs) -> PolicyLossOutput:
    from gyre.algos.loss_variants import gmpo_loss

    return gmpo_loss(x.logprobs, x.old_logprobs, x.advantages, x.mask, k.clip_low, k.clip_high)


@dataclass(frozen=True)
class SapoKnobs:
    """SAPO (arXiv 2511.20347): a soft gate sigmoid(tau (rho - 1)) 4 / tau in place of the clip."""

    tau_pos: float = knob(1.0, gt=0)
    """Temperature of the soft gate where A > 0 (the paper's 1.0; verl's tau_pos)."""
    tau_neg: float = knob(1.05, gt=0)
    """Temperature of the soft gate where A <= 0 (the paper's 1.05: negative tokens decay faster)."""


def _sapo(x: PolicyLossInputs, s: PolicyLossSpec, k: SapoKnobs) -> PolicyLossOutput:
    from gyre.algos.loss_variants import sapo_loss

    return sapo_loss(x.logprobs, x.old_logprobs, x.advantages, x.mask, k.tau_pos, k.tau_neg)


# ---- the table ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyLossVariant:
    """One row of ``POLICY_LOSSES``: the loss, its knobs and what the config must know about it."""

    loss: PolicyLossFn
    knobs: type | None = None
    """The dataclass of its own knobs (the config's ``algorithm.loss.<name>`` section); None: it has none."""
    shared: tuple[str, ...] = ()
    """The loss section's shared keys it reads besides ratio_level (``gyre check`` shows them with its own)."""
    sequence_ratio: bool = False
    """Honours ``ratio_level="sequence"`` (GSPO); the config refuses that level for the others."""
    uses_behaviour: bool = False
    """Compares the trainer's pi_old with the sampler's log-probs, so pi_old must be recomputed."""
    has_ratio: bool = True
    """False for a loss without importance ratio: correct only on-policy (the config warns otherwise)."""


_CLIP = ("clip_low", "clip_high")

POLICY_LOSSES: Registry[PolicyLossVariant] = Registry("policy loss", {
    "ppo": PolicyLossVariant(_ppo, PpoKnobs, _CLIP, sequence_ratio=True),
    "vanilla": PolicyLossVariant(_vanilla, has_ratio=False),  # REINFORCE, -A log pi: on-policy only
    "tis": PolicyLossVariant(_tis, TisKnobs),
    "topr": PolicyLossVariant(_topr, ToprKnobs),
    "cispo": PolicyLossVariant(_cispo, CispoKnobs),
    "kimi15": PolicyLossVariant(_kimi15, Kimi15Knobs),
    "decoupled_ppo": PolicyLossVariant(_decoupled_ppo, DecoupledPpoKnobs, _CLIP, uses_behaviour=True),
    "clip_cov": PolicyLossVariant(_clip_cov, ClipCovKnobs, _CLIP),
    "kl_cov": PolicyLossVariant(_kl_cov, KlCovKnobs),
    "gmpo": PolicyLossVariant(_gmpo, GmpoKnobs),
    "sapo": PolicyLossVariant(_sapo, SapoKnobs),
})
"""The policy losses by config name (``algorithm.loss.variant``); the config accepts the names of this table
and gives each row's knobs a section of their own."""


@dataclass(frozen=True)
class PolicyLossSpec:
    """The policy loss's variant and knobs: everything the step loss needs besides the batch.

    Declared once, here: the config's ``algorithm.loss`` section takes its keys from these fields (names,
    types, defaults and bounds) and a sub-section per variant from ``POLICY_LOSSES``
    (``gyre.config.base.section_from_spec``), and builds the spec back from them (``AlgorithmConfig.loss_spec``);
    ``run_field`` fields are filled in by the driver. A plain frozen record, it pickles cheaply to every
    trainer rank, which looks the variant up in ``POLICY_LOSSES`` once, when it builds the loss.
    """

    variant: str = knob("ppo", choices=POLICY_LOSSES)
    """The loss, a name of ``gyre.algos.loss_table.POLICY_LOSSES``: ppo (PPO's clip; GSPO with ratio_level
    sequence), vanilla (REINFORCE, -A log pi: on-policy only), tis (truncated IS weight), topr (TOPR), cispo
    (CISPO: clipped IS weight, every token keeps a gradient), kimi15 (Kimi k1.5's squared log-ratio),
    decoupled_ppo (trust region around the proximal policy, behaviour weight for stale samples), clip_cov and
    kl_cov (the entropy mechanism's covariance-based clip and KL), gmpo (geometric mean), sapo (soft gate).
    A variant's own knobs are the section of its name (algorithm.loss.cispo.low)."""
    ratio_level: RatioLevel = "token"
    """sequence: GSPO's length-normalised sequence ratio (the ppo loss only)."""
    clip_low: float = knob(0.2, ge=0, le=1)
    """eps_low of the trust region (ppo, decoupled_ppo, clip_cov); 1 leaves the ratio unbounded below (Clip-Cov's
    recipe)."""
    clip_high: float = knob(0.2, ge=0)
    """eps_high of the trust region (ppo, decoupled_ppo, clip_cov); DAPO's clip-higher raises it."""
    agg: AggMode = "token-mean"
    """How token losses become the step loss, for the policy and the critic (``gyre.algos.aggregation``)."""
    entropy_coef: float = knob(0.0, ge=0)
    """Entropy bonus subtracted from the loss."""
    knobs: Any = variant_knobs(POLICY_LOSSES, "variant")
    """The variant's own knobs (its row's dataclass), from the section of its name."""
    kl: KLSpec = run_field(KLSpec(), "algorithm.kl")
    """The KL-to-reference loss term (``loss_*``) and the clamp of its estimates."""
    temperature: float = run_field(1.0, "rollout.sampling.temperature")
    """Log-probs are taken at the sampling temperature."""
    old_source: OldSource = run_field("recomputed", "the run plan")
    """Where pi_old comes from: "recomputed" (batch.old_logprobs), "rollout" (the sampler's log-probs) or
    "current" (the detached current log-probs)."""
    distill_loss_coef: float = run_field(0.0, "algorithm.distill.coef under distill.mode loss")
    """Weight of the on-policy distillation loss term 1/2 (log pi_theta - log pi_teacher)^2
    (``gyre.algos.distill``); 0: none."""

    def __post_init__(self) -> None:
        resolve_knobs(self)
