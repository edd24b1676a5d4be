"""Every policy loss and estimator of the tables is reachable from a config, and the config's loss keys
are the loss spec's fields (declared once, on the spec)."""

import dataclasses
import math

import pytest
import torch

from gyre.algos import LossDenominator
from gyre.algos.advantages import ESTIMATORS
from gyre.algos.policy_loss import POLICY_LOSSES, PolicyLossSpec
from gyre.config import ConfigError, load_config, make_plan
from gyre.config.schema import AlgorithmConfig, PolicyLossKnobs
from gyre.data.batching import collate_groups
from gyre.engines.losses import PolicyLoss
from gyre.training.advantage import AlgorithmState, estimate_advantages
from gyre.types import MetricSums, TrainBatch
from tests.training.test_advantage import groups_of, sample, stage, to_batch
from tests.training.test_turn_advantages import episode, group

RUN_FIELDS = {f.name for f in dataclasses.fields(PolicyLossSpec) if "from_run" in f.metadata}  # filled by the driver


def test_loss_keys_are_the_spec_fields_with_its_defaults():
    spec_fields = [f.name for f in dataclasses.fields(PolicyLossSpec) if f.name not in RUN_FIELDS]
    assert list(PolicyLossKnobs.model_fields) == spec_fields
    assert set(spec_fields) <= set(AlgorithmConfig.model_fields)
    assert AlgorithmConfig().loss_spec(1.0, "recomputed") == PolicyLossSpec()


def test_loss_spec_carries_every_key():
    overrides = {"policy_loss": "decoupled_ppo", "clip_low": 0.1, "clip_high": 0.3, "dual_clip_c": 2.0,
                 "tis_low": 0.1, "tis_high": 0.9, "topr_positive_weight": 0.7, "topr_negative_weight": 0.5,
                 "cispo_low": 0.2, "cispo_high": 0.25, "cispo_unified_mask": True, "kimi15_tau": 0.4,
                 "behaviour_cap": 1.5, "clip_cov_ratio": 0.01, "clip_cov_lb": 0.5, "clip_cov_ub": 2.0,
                 "kl_cov_ratio": 0.05, "kl_cov_coef": 0.5, "gmpo_clip_low": 0.3, "gmpo_clip_high": 0.35,
                 "sapo_tau_pos": 1.5, "sapo_tau_neg": 2.5, "loss_agg": "seq-mean-token-mean", "kl_loss_coef": 0.01,
                 "kl_loss_estimator": "k1", "kl_loss_grad_estimator": "k2", "kl_clamp": 5.0, "entropy_coef": 0.001}
    assert set(overrides) == set(PolicyLossKnobs.model_fields) - {"ratio_level"}  # sequence needs ppo
    cfg, _ = stage(*(f"algorithm.{k}={v}" for k, v in overrides.items()))
    spec = cfg.algorithm.loss_spec(0.7, "rollout")
    assert spec == PolicyLossSpec(temperature=0.7, old_source="rollout", **overrides)


def two_token_batch() -> TrainBatch:
    return TrainBatch(input_ids=torch.tensor([[5, 6, 7]]), attention_mask=torch.ones(1, 3, dtype=torch.long),
                      response_mask=torch.tensor([[0.0, 1.0, 1.0]]), advantages=torch.tensor([[0.0, 1.0, -0.5]]),
                      rollout_logprobs=torch.tensor([[0.0, -1.1, -2.2]]),
                      old_logprobs=torch.tensor([[0.0, -1.0, -2.0]]), ref_logprobs=None, scores=torch.tensor([1.0]))


@pytest.mark.parametrize("name", POLICY_LOSSES.names)
def test_every_policy_loss_is_reachable_from_config(name):
    cfg, _ = stage(f"algorithm.policy_loss={name}")
    loss = PolicyLoss(LossDenominator(tokens=2), cfg.algorithm.loss_spec(1.0, "recomputed"))
    assert loss.variant is POLICY_LOSSES.get(name)
    lp = torch.tensor([[0.0, -0.9, -2.1]], requires_grad=True)
    value = loss(two_token_batch(), lp, None, MetricSums())
    value.backward()
    assert math.isfinite(value.item()) and lp.grad[0, 1:].abs().sum() > 0


def test_unknown_names_are_refused_with_the_valid_ones():
    with pytest.raises(ConfigError, match="algorithm.policy_loss: Input should be 'ppo', 'vanilla', 'tis', 'topr', "
                                          "'cispo', 'kimi15', 'decoupled_ppo', 'clip_cov', 'kl_cov', 'gmpo' or 'sapo'"):
        stage("algorithm.policy_loss=ppo2")
    with pytest.raises(ConfigError, match="algorithm.estimator: Input should be 'reinforce', 'rloo', "
                                          "'group_centred_batch_std', 'gae', 'step_returns', 'rebn', 'gigpo', "
                                          "'chunk_returns', 'remax', 'opo', 'pass_at_k' or 'gpg'"):
        stage("algorithm.estimator=grpo")
    # A spec built by hand is checked when the trainer builds its loss, before any batch.
    with pytest.raises(ValueError, match="unknown policy loss 'ppo2'; valid names: ppo, vanilla"):
        PolicyLoss(LossDenominator(tokens=2), PolicyLossSpec(policy_loss="ppo2"))


TOKEN_LEVEL = [n for n in ESTIMATORS.names if ESTIMATORS.get(n).turns is None]
TURN_LEVEL = [n for n in ESTIMATORS.names if ESTIMATORS.get(n).turns is not None]


@pytest.mark.parametrize("name", TOKEN_LEVEL)
def test_every_estimator_is_reachable_from_config(name):
    entry = ESTIMATORS.get(name)
    scopes = [] if entry.scoped else ["algorithm.norm_mean=none", "algorithm.norm_std=none"]
    # pass_k=1: with G = 2, k = 2 puts both samples in the one subset, which gives every sample 0.
    cfg, plan = stage(f"algorithm.estimator={name}", "algorithm.pass_k=1", *scopes)
    assert plan.use_critic == entry.critic
    state = AlgorithmState.create(cfg.algorithm)
    assert state.estimator is entry
    samples = [sample(0, 0, 1.0, 2), sample(0, 1, 0.0, 2)]
    batch = to_batch(samples, 0)
    batch.values = torch.zeros_like(batch.response_mask) if entry.critic else None
    groups = groups_of(samples)
    if entry.greedy:  # ReMax: the prompt's greedy response scored 0.5
        groups[0].greedy = sample(0, -1, 0.5, 2)
    estimate_advantages(batch, groups, cfg.algorithm, plan, state, cfg.rollout.sampling.max_new_tokens)
    # Sample 0 scored 1, sample 1 scored 0: every estimator gives the first a positive advantage.
    assert batch.advantages[0].sum() > 0 > batch.advantages[1].sum()
    assert (batch.returns is not None) == entry.critic


@pytest.mark.parametrize("name", TURN_LEVEL)
def test_every_turn_estimator_is_reachable_from_config(name):
    entry = ESTIMATORS.get(name)
    scopes = [] if entry.scoped else ["algorithm.norm_mean=none", "algorithm.norm_std=none"]
    cfg = load_config(None, ["model.path=m", "data.train_files=[t.jsonl]", f"algorithm.estimator={name}", *scopes])
    assert cfg.algorithm.uses_turns and not cfg.algorithm.uses_critic
    # A run that learns from prompts samples single responses: refused when the run is planned.
    with pytest.raises(ConfigError, match=f"estimator={name} assigns credit to the turns of multi-turn episodes, "
                                          "but this run learns from prompts"):
        make_plan(cfg, "cpu", 4)
    state = AlgorithmState.create(cfg.algorithm)
    assert state.estimator is entry
    groups = [group("g0", episode(0, [(2, 0.0, "s0"), (2, 1.0, "s1")]), episode(1, [(2, 0.0, "s0"), (2, 0.0, "s2")]))]
    batch, _ = collate_groups(groups, 0)
    _, plan = stage()
    estimate_advantages(batch, groups, cfg.algorithm, plan, state, cfg.rollout.sampling.max_new_tokens)
    # The first episode is paid, the second is not: every turn estimator credits the first more.
    assert batch.advantages[0].sum() > batch.advantages[1].sum() and batch.returns is None


def test_turn_estimators_refuse_the_token_kl_penalty():
    with pytest.raises(ConfigError, match="kl_reward_coef puts a per-token KL penalty into the token rewards, which "
                                          "estimator=gigpo"):
        stage("algorithm.estimator=gigpo", "algorithm.kl_reward_coef=0.1")


def test_gigpo_knobs_without_gigpo_are_noted():
    _, plan = stage("algorithm.gigpo_step_gamma=0.9")
    assert "algorithm.gigpo_step_gamma: no effect, estimator=reinforce is not gigpo" in plan.notes
