"""Algorithm maths as pure tensor functions (torch and numpy only; no Ray or transformers).

Shapes use B for samples, T for padded response tokens, N for prompt groups of G samples each.
Modules: ``advantages`` (estimators and reward normalisation), ``baselines`` (ReMax, OPO, the pass@k
advantage, GPG's scale), ``agentic`` (multi-turn credit: step returns, ReBN, GiGPO, IPA chunk returns),
``policy_loss`` (PPO and its variants), ``loss_variants`` (Clip-Cov, KL-Cov, GMPO, SAPO), ``loss_output``
(what every loss returns), ``preference`` (pairwise losses: DPO, IPO, SLiC hinge, robust DPO, SimPO, RPO),
``aggregation`` (loss modes with global denominators; ``AGGREGATIONS``), ``kl`` (estimators,
straight-through), ``masks``, ``mismatch`` (train-inference correction), ``value`` (critic loss), ``stats``
and ``pass_at_k`` (evaluation over k samples).

Without torch, for the config: ``tables`` (the ``Registry`` behind the tables, ``knob``), ``loss_table``
(the policy losses by name with their knobs, ``POLICY_LOSSES``, and ``PolicyLossSpec``),
``estimator_table`` (the advantage estimators by name with their knobs, ``ESTIMATORS``, and
``AdvantageSpec``) and ``specs`` (the records and names of the other families).

The names below are importable from ``gyre.algos`` itself; each module is imported on first use (PEP 562),
so importing the package stays free of torch.
"""

from __future__ import annotations

import importlib

_MODULES: dict[str, tuple[str, ...]] = {
    "advantages": (
        "discounted_returns", "gae_advantages", "group_centred_batch_std_advantages", "group_normalized_advantages",
        "normalize_rewards", "outcome_token_rewards", "rloo_advantages"
    ),
    "agentic": (
        "chunk_returns", "gigpo_advantages", "gigpo_step_advantages", "grouped_normalize", "rebn_advantages",
        "turn_returns"
    ),
    "aggregation": ("LossDenominator", "aggregate_loss", "denominator_for"),
    "estimator_table": ("AdvantageEstimator", "AdvantageSpec", "ESTIMATORS"),
    "kl": ("AdaptiveKLController", "kl_estimate", "kl_penalized_rewards"),
    "masks": ("difficulty_mask", "overlong_mask", "soft_overlong_penalty"),
    "loss_table": ("POLICY_LOSSES", "PolicyLossSpec", "PolicyLossVariant"),
    "mismatch": ("importance_weights", "mismatch_filter", "mismatch_metrics"),
    "pass_at_k": ("mean_at_k", "mean_pass_at_k", "pass_at_k"),
    "policy_loss": (
        "PolicyLossInputs", "PolicyLossOutput", "cispo_loss", "decoupled_ppo_loss", "kimi15_loss", "ppo_clip_loss",
        "tis_loss", "topr_loss", "vanilla_pg_loss"
    ),
    "preference": ("PairLogps", "PreferenceLossOutput", "preference_loss"),
    "specs": ("CreditSpec", "KLSpec", "PreferenceLossSpec"),
    "stats": ("RunningMoments", "masked_mean", "masked_sum", "masked_whiten"),
    "tables": ("Registry",),
    "value": ("explained_variance", "value_loss"),
}
_HOME = {name: module for module, names in _MODULES.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str):
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'gyre.algos' has no attribute {name!r}")
    return getattr(importlib.import_module(f"gyre.algos.{module}"), name)
