"""Algorithm maths as pure tensor functions (torch and numpy only; no Ray or transformers).

Shapes use B for samples, T for padded response tokens, N for prompt groups of G samples each.
Modules: ``advantages`` (estimators and reward normalisation; the ``ESTIMATORS`` table), ``baselines``
(ReMax, OPO, the pass@k advantage, GPG's scale), ``agentic`` (multi-turn credit: step returns, ReBN, GiGPO,
IPA chunk returns), ``policy_loss`` (PPO and its variants; the ``POLICY_LOSSES`` table and
``PolicyLossSpec``), ``loss_variants`` (Clip-Cov, KL-Cov, GMPO, SAPO), ``loss_output`` (what every loss
returns), ``tables`` (the ``Registry`` behind the tables), ``preference`` (pairwise losses: DPO, IPO, SLiC
hinge, robust DPO, SimPO, RPO), ``aggregation`` (loss modes with global denominators; ``AGGREGATIONS``),
``kl`` (estimators, straight-through), ``masks``, ``mismatch`` (train-inference correction), ``value``
(critic loss), ``stats`` and ``pass_at_k`` (evaluation over k samples).
"""

from gyre.algos.advantages import (
    ESTIMATORS,
    AdvantageEstimator,
    discounted_returns,
    gae_advantages,
    group_centred_batch_std_advantages,
    group_normalized_advantages,
    normalize_rewards,
    outcome_token_rewards,
    rloo_advantages,
)
from gyre.algos.agentic import (
    chunk_returns,
    gigpo_advantages,
    gigpo_step_advantages,
    grouped_normalize,
    rebn_advantages,
    turn_returns,
)
from gyre.algos.aggregation import LossDenominator, aggregate_loss, denominator_for
from gyre.algos.kl import AdaptiveKLController, kl_estimate, kl_penalized_rewards
from gyre.algos.masks import difficulty_mask, overlong_mask, soft_overlong_penalty
from gyre.algos.mismatch import importance_weights, mismatch_filter, mismatch_metrics
from gyre.algos.pass_at_k import mean_at_k, mean_pass_at_k, pass_at_k
from gyre.algos.policy_loss import (
    POLICY_LOSSES,
    PolicyLossInputs,
    PolicyLossOutput,
    PolicyLossSpec,
    PolicyLossVariant,
    cispo_loss,
    decoupled_ppo_loss,
    kimi15_loss,
    ppo_clip_loss,
    tis_loss,
    topr_loss,
    vanilla_pg_loss,
)
from gyre.algos.preference import PairLogps, PreferenceLossOutput, PreferenceLossSpec, preference_loss
from gyre.algos.stats import RunningMoments, masked_mean, masked_sum, masked_whiten
from gyre.algos.tables import Registry
from gyre.algos.value import explained_variance, value_loss

__all__ = [
    "ESTIMATORS", "POLICY_LOSSES", "AdaptiveKLController", "AdvantageEstimator", "LossDenominator",
    "PairLogps", "PolicyLossInputs", "PolicyLossOutput", "PolicyLossSpec", "PolicyLossVariant", "PreferenceLossOutput",
    "PreferenceLossSpec", "Registry", "RunningMoments",
    "aggregate_loss",
    "chunk_returns", "cispo_loss", "decoupled_ppo_loss", "denominator_for", "difficulty_mask", "discounted_returns",
    "explained_variance", "gae_advantages", "gigpo_advantages", "gigpo_step_advantages",
    "group_centred_batch_std_advantages", "group_normalized_advantages",
    "grouped_normalize", "importance_weights", "kimi15_loss",
    "kl_estimate", "kl_penalized_rewards", "masked_mean", "mean_at_k", "mean_pass_at_k", "pass_at_k",
    "masked_sum", "masked_whiten", "mismatch_filter", "preference_loss",
    "mismatch_metrics", "normalize_rewards", "outcome_token_rewards", "overlong_mask", "ppo_clip_loss",
    "rebn_advantages", "rloo_advantages", "soft_overlong_penalty", "tis_loss",
    "topr_loss", "turn_returns", "vanilla_pg_loss", "value_loss",
]
