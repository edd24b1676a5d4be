"""The ``algorithm`` section of a run config: one sub-section per concern, or a preset that fills them.

``advantage`` (the estimator, reward normalisation, discount, whitening), ``loss`` (the policy loss, its
clip range and aggregation), ``kl`` (to the reference model), ``masks`` (samples left out of the loss),
``critic`` (how the critic trains and, with several, how they split the data), ``distill`` (on-policy
distillation), ``mismatch`` (train-inference correction) and ``credit`` (attention-based credit).

``advantage`` and ``loss`` are generated from the torch-free tables of ``gyre.algos``
(``estimator_table.AdvantageSpec``, ``loss_table.PolicyLossSpec``): their shared keys from the spec's fields
and one sub-section per estimator or loss variant with knobs, from that row's knobs dataclass
(``algorithm.loss.cispo.low``), so a new variant changes nothing here. Keys of the earlier flat section
(``algorithm.cispo_low``) still load: ``gyre.config.aliases`` rewrites them to their new place with a notice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, model_validator

from gyre.algos.estimator_table import ESTIMATORS, AdvantageEstimator, AdvantageSpec
from gyre.algos.loss_table import POLICY_LOSSES, OldSource, PolicyLossSpec, PolicyLossVariant
from gyre.algos.specs import (
    CreditSpec,
    DataDivision,
    DistillMode,
    Divergence,
    DivergenceLevel,
    KLSpec,
    ValueAggregation,
)
from gyre.algos.tables import knob
from gyre.config.base import NonNegInt, PositiveFloat, StrictModel, UnitFloat, section_from_spec
from gyre.config.presets import algorithm_problems, expand_preset

Level = Literal["none", "token", "segment", "geometric", "sequence"]


class MismatchConfig(StrictModel):
    """Train-inference mismatch correction (ROLL ``train_infer_correction``): the trainer's pi_old against
    the sampler's log-probs mu. Needs recomputed old log-probs (the plan turns recomputation on).

    Every ratio here is pi_old / mu, the trainer's probability over the sampler's (log-ratio
    log pi_old - log mu), as in ROLL and verl's rollout_is. Some frameworks bound the inverse: verl's k1
    rejection (rollout_rs token_k1, seq_sum_k1, seq_mean_k1 with a "lo_hi" threshold) keeps
    lo <= mu / pi_old <= hi, which is ratio_low = 1 / hi, ratio_high = 1 / lo here."""

    weight: Level = "none"
    """Importance weight pi_old / mu multiplying each token's loss, at this granularity; none turns it off."""
    upper_bound: PositiveFloat = 1.2
    """The weight pi_old / mu is truncated at this value (verl's rollout_is_threshold, same direction)."""
    filter: Level = "none"
    """Drop tokens / segments / sequences whose ratio pi_old / mu (at this granularity) leaves
    [ratio_low, ratio_high] (k1 rejection: the log-ratio log pi_old - log mu outside [ln low, ln high])."""
    ratio_low: Annotated[float, Field(ge=0)] = 0.8
    """Lower bound on pi_old / mu, trainer over sampler (not mu / pi_old: a bound ported from a framework
    that rejects on mu / pi_old becomes 1 / its upper bound here)."""
    ratio_high: PositiveFloat = 1.2
    """Upper bound on pi_old / mu, trainer over sampler (1 / the lower bound of an inverse-ratio threshold)."""
    diff_low: float | None = None
    """Optional bounds on p_old - p_mu as well (the diff filter)."""
    diff_high: float | None = None
    """Upper bound on p_old - p_mu (the diff filter); None: no upper bound."""
    normalize_weights: bool = False
    """Divide the importance weights by their mean over the batch's units (tokens; segments; rows at the
    geometric and sequence levels) after truncation, so they average 1 (verl's rollout_is_batch_normalize)."""
    divergence: Literal["none"] | Divergence = "none"
    """Reject tokens or rows whose estimate of KL(mu || pi_old) exceeds divergence_max: k2 = d^2 / 2 or
    k3 = exp(d) - 1 - d per token, d = log pi_old - log mu (verl's rollout_rs *_k2 / *_k3); none turns it off."""
    divergence_level: DivergenceLevel = "sequence_mean"
    """What a token is judged by: its own estimate (token), or its row's sum, mean or max of them
    (sequence_sum, sequence_mean, sequence_max: the whole row stays or leaves; verl's seq_sum, seq_mean, seq_max)."""
    divergence_max: PositiveFloat = 0.01
    """The largest divergence kept (verl's decoupled_k3_rs: seq_mean_k3 at 0.01)."""

    @property
    def enabled(self) -> bool:
        return self.weight != "none" or self.filter != "none" or self.divergence != "none"

    @model_validator(mode="after")
    def _weights_to_normalize(self) -> MismatchConfig:
        if self.normalize_weights and self.weight == "none":
            raise ValueError("algorithm.mismatch.normalize_weights normalises the importance weights, which are off; "
                             "set algorithm.mismatch.weight (token, segment, geometric or sequence)")
        return self


class AdvantageConfig(section_from_spec(AdvantageSpec, "AdvantageKnobs", __name__)):
    """How rewards become advantages: the estimator (and its own knobs, in the section of its name), the
    normalisation of the rewards, the discount, whitening and clips (``gyre.algos.estimator_table``)."""

    @property
    def row(self) -> AdvantageEstimator:
        """The row of ``ESTIMATORS`` that ``estimator`` names."""
        return ESTIMATORS.get(self.estimator)


@dataclass(frozen=True)
class LossPlanKeys:
    """Loss keys the run plan reads, not the trainers (``PolicyLossSpec`` does not carry them)."""

    agg_norm: int | None = knob(None, gt=0)
    """The constant of seq-mean-token-sum-norm; default rollout.sampling.max_new_tokens (the plan resolves
    it, and each optimizer step's loss denominator carries it to the trainers)."""


class LossConfig(section_from_spec(PolicyLossSpec, "LossKnobs", __name__, config_keys=LossPlanKeys)):
    """The policy loss (``gyre.algos.loss_table``): the variant (its own knobs in the section of its name),
    the clip range the clipped variants share, how token losses are aggregated, the entropy bonus."""

    @property
    def row(self) -> PolicyLossVariant:
        """The row of ``POLICY_LOSSES`` that ``variant`` names."""
        return POLICY_LOSSES.get(self.variant)


KLConfig = section_from_spec(KLSpec, "KLConfig", __name__)


class MasksConfig(StrictModel):
    """Samples taken out of the loss, and DAPO's soft overlong punishment of the reward."""

    overlong: bool = False
    """Truncated responses (hit max_new_tokens) leave the loss (DAPO overlong filtering)."""
    overlong_penalty_frac: Annotated[float, Field(gt=0, le=1)] | None = None
    """DAPO soft overlong punishment with L_cache = this fraction of max_new_tokens; None turns it off."""
    difficulty: tuple[UnitFloat, UnitFloat] | None = None
    """(low, high): keep a prompt's group only if low < mean reward < high; (0, 1) drops groups with no
    reward variance (DAPO's dynamic-sampling filter)."""


class CriticAlgorithmConfig(StrictModel):
    """How the critic (estimator gae) trains, and with several critics (critic.num_critics > 1, AsyPPO) how
    their values combine, how they split the data and what their disagreement masks."""

    value_clip: PositiveFloat | None = None
    """Clip the new values to within +-value of the old ones in the critic's loss (PPO's value clip);
    None: no clip."""
    warmup: NonNegInt = 0
    """RL steps that train only the critic before the policy starts to move."""
    value_aggregation: ValueAggregation = "mean"
    """With critic.num_critics > 1, the value GAE uses: the critics' mean (AsyPPO; its ablation favours it)
    or their min."""
    data_division: DataDivision = "group_response_split"
    """How each batch's rows are divided among several critics (critic.num_critics > 1), each training on its
    share only: group_response_split gives every critic an equal share of each prompt's responses
    (rollout.samples_per_prompt a multiple of num_critics); prompt_shard gives each critic whole prompts
    (rollout.prompts_per_step a multiple of num_critics)."""
    adv_mask_low_pct: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """AsyPPO's advantage mask, a fraction k: the advantages of the ceil(k * n) valid tokens of the batch
    where the critics disagree least (lowest std of their values) become 0; needs critic.num_critics >= 2."""
    entropy_filter_high_pct: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """AsyPPO's entropy filter, a fraction h: the ceil(h * n) valid tokens where the critics disagree most
    leave the entropy term (loss.entropy_coef); needs critic.num_critics >= 2."""


class DistillConfig(StrictModel):
    """On-policy distillation (``gyre.algos.distill``): the student learns from a teacher's log-probs on its
    own samples (the ``teacher`` section names the teacher's model)."""

    coef: Annotated[float, Field(ge=0)] = 0.0
    """Weight of the per-token reverse KL to the teacher (ROLL ``opd_kl_coef``); > 0 creates the teacher role."""
    mode: DistillMode = "advantage"
    """pure: each token's advantage is -coef * (log pi_student - log pi_teacher) of its sampled token and the
    task reward is unused (ROLL ``is_pure_opd``; the opd preset). advantage: that term is added to the RL
    advantage after the estimator, before whitening (ROLL ``use_opd``). loss: the RL advantage is left alone
    and coef * 1/2 (log pi_theta - log pi_teacher)^2 joins the loss, whose gradient is the reverse-KL
    gradient on the student's samples."""


CreditKnobs = section_from_spec(
    CreditSpec, "CreditKnobs", __name__,
    """Attention-based credit (arXiv 2510.13554): the fields of ``gyre.algos.specs.CreditSpec``
    (declared and documented there; tau_waad, tau_delta and alpha are unpublished, gyre's defaults).""")


class AlgorithmConfig(StrictModel):
    """Advantage estimation, policy loss, KL, masks, the critic's training, distillation, mismatch correction
    and attention credit, one sub-section each. ``preset`` (or ``algorithm: NAME``) fills them from
    ``gyre.config.presets``; keys written here override the preset's values."""

    preset: str | None = None
    """grpo, dr_grpo, dapo, lite_ppo, ppo, reinforce_pp, reinforce_pp_baseline, rloo, gspo, cispo, topr, remax,
    opo, gpg, clip_cov, kl_cov, gmpo, sapo, asyppo, opd (``gyre.config.presets``: each sets the knobs of its
    paper; asyppo also sets critic.num_critics)."""
    advantage: AdvantageConfig = AdvantageConfig()
    """The advantage estimator with its own knobs, reward normalisation, discount, whitening and clips."""
    loss: LossConfig = LossConfig()
    """The policy loss variant with its own knobs, the shared clip range, aggregation and entropy bonus."""
    kl: KLConfig = KLConfig()
    """KL to the reference model: a loss term, a reward penalty (fixed or adaptive), the clamp of both."""
    masks: MasksConfig = MasksConfig()
    """Samples left out of the loss (overlong, no reward variance) and the soft overlong punishment."""
    critic: CriticAlgorithmConfig = CriticAlgorithmConfig()
    """How the critic trains (value clip, warm-up) and how several critics combine and split the data (AsyPPO);
    where it runs is the top-level critic section."""
    distill: DistillConfig = DistillConfig()
    """On-policy distillation from a teacher model (the teacher section names it)."""
    mismatch: MismatchConfig = MismatchConfig()
    """Train-inference mismatch correction: importance weights and rejection by pi_old / mu."""
    credit: CreditKnobs = CreditKnobs()
    """Attention-based credit: non-negative advantages of selected tokens scaled by gamma_amp, the tokens
    chosen from the policy's own attention (local_chunk, global_anchor, coupled: an extra eager-attention
    forward of the policy per step), its entropy, or at random; strategy none (the default) turns it off."""
    old_logprobs: Literal["auto", "recompute", "rollout"] = "auto"
    """Where pi_old comes from, for the loss's ratio, the KL penalty, distillation and mismatch correction:
    recompute with the trainer, or the sampler's log-probs. auto: with rollout.async_ratio > 0 the sampler's
    (the ratio then corrects for stale samples), unless the loss variant or mismatch correction compares pi_old
    with the sampler; otherwise recomputed when there is more than one optimizer step per rollout batch or
    mismatch correction weighs the batch, else the detached log-probs of the training forward pass."""

    @model_validator(mode="before")
    @classmethod
    def _expand_preset(cls, data: object) -> object:
        return expand_preset(data)

    @model_validator(mode="after")
    def _consistent(self) -> AlgorithmConfig:
        for problem in algorithm_problems(self):
            raise ValueError(problem)
        return self

    @property
    def uses_turns(self) -> bool:
        """The estimator assigns credit per model turn (multi-turn trajectories only)."""
        return self.advantage.row.turns is not None

    @property
    def uses_critic(self) -> bool:
        return self.advantage.row.critic

    def loss_spec(self, temperature: float, old_source: OldSource) -> PolicyLossSpec:
        """The loss spec trainers get: the loss section, the KL section's loss term, and the run's values."""
        return self.loss.spec(temperature=temperature, old_source=old_source, kl=self.kl.spec(),
                              distill_loss_coef=self.distill.coef if self.distill.mode == "loss" else 0.0)

    @property
    def credit_spec(self) -> CreditSpec:
        """The attention-credit knobs as the trainer and the advantage stage take them."""
        return self.credit.spec()

    @property
    def uses_teacher(self) -> bool:
        """On-policy distillation: a teacher role scores every batch."""
        return self.distill.coef > 0

    @property
    def uses_reference(self) -> bool:
        return self.kl.loss_coef > 0 or self.kl.reward_coef > 0

    @property
    def needs_trainer_old_logprobs(self) -> list[str]:
        """Knobs that compare the trainer's pi_old with the sampler's log-probs (so pi_old is recomputed)."""
        return [knob for knob, on in ((f"algorithm.loss.variant={self.loss.variant}", self.loss.row.uses_behaviour),
                                      ("algorithm.mismatch", self.mismatch.enabled)) if on]

    @property
    def uses_groups(self) -> bool:
        """Whether advantages or masks compare the samples of one prompt with each other."""
        adv = self.advantage
        return "group" in (adv.norm_mean, adv.norm_std) or adv.row.groups or self.masks.difficulty is not None

