"""Every policy loss and estimator of the tables is reachable from a config, and the config's loss and
advantage keys are their specs' fields and their rows' knobs (declared once, on the spec and the row)."""

import dataclasses
import math
import pickle

import pytest
import torch

from gyre.algos import LossDenominator
from gyre.algos.estimator_table import ESTIMATORS, AdvantageSpec, GaeKnobs, GigpoKnobs, PassAtKKnobs
from gyre.algos.loss_table import (
    POLICY_LOSSES,
    CispoKnobs,
    ClipCovKnobs,
    DecoupledPpoKnobs,
    GmpoKnobs,
    Kimi15Knobs,
    KlCovKnobs,
    PolicyLossSpec,
    PpoKnobs,
    SapoKnobs,
    TisKnobs,
    ToprKnobs,
)
from gyre.algos.specs import KLSpec
from gyre.config import ConfigError, load_config, make_plan
from gyre.config.algorithm_schema import AlgorithmConfig, LossPlanKeys
from gyre.data.batching import collate_groups
from gyre.engines.losses import PolicyLoss
from gyre.training.advantage import AlgorithmState, estimate_advantages
from gyre.types import MetricSums, TrainBatch
from tests.training.test_advantage import groups_of, sample, stage, to_batch
from tests.training.test_turn_advantages import episode, group


def _keys(spec: type) -> list[str]:
    """The config keys of a spec: its fields but those the driver fills in and the variant's knobs."""
    return [f.name for f in dataclasses.fields(spec) if not {"from_run", "variants"} & set(f.metadata)]


@pytest.mark.parametrize("section, spec, table, extra", [
    ("loss", PolicyLossSpec, POLICY_LOSSES, [f.name for f in dataclasses.fields(LossPlanKeys)]),
    ("advantage", AdvantageSpec, ESTIMATORS, []),
])
def test_section_keys_are_the_spec_fields_then_one_section_per_variant(section, spec, table, extra):
    model = AlgorithmConfig.model_fields[section].annotation
    variants = [name for name in table.names if table.get(name).knobs is not None]
    assert list(model.model_fields) == _keys(spec) + extra + variants
    for name in variants:  # each variant's section holds its row's knobs, with their defaults
        knobs = table.get(name).knobs
        assert list(model.model_fields[name].annotation.model_fields) == _keys(knobs)
        assert getattr(model(), name).spec() == knobs()


def test_a_config_with_generated_sections_pickles():
    # Configs cross process boundaries pickled: every generated section must be found again by name.
    cfg = load_config(None, ["model.path=m", "data.train_files=[t.jsonl]", "algorithm.preset=cispo",
                             "algorithm.loss.cispo.low=0.3", "algorithm.advantage.gae.lam=0.9"])
    again = pickle.loads(pickle.dumps(cfg))
    assert again == cfg and again.algorithm.loss.cispo.low == 0.3 and again.algorithm.advantage.gae.lam == 0.9


def test_default_sections_build_the_default_specs():
    a = AlgorithmConfig()
    assert a.loss_spec(1.0, "recomputed") == PolicyLossSpec() and PolicyLossSpec().knobs == PpoKnobs()
    assert a.advantage.spec() == AdvantageSpec() and AdvantageSpec().knobs is None  # reinforce has no knobs
    assert a.kl.spec() == KLSpec()


# Every key of the loss and KL sections off its default; each variant's knobs its own values.
SHARED = {"clip_low": 0.1, "clip_high": 0.3, "agg": "seq-mean-token-mean", "entropy_coef": 0.001}
KL = {"loss_coef": 0.01, "loss_estimator": "k1", "loss_grad_estimator": "k2", "clamp": 5.0}
VARIANTS = {
    "ppo": PpoKnobs(dual_clip_c=2.0), "tis": TisKnobs(low=0.1, high=0.9),
    "topr": ToprKnobs(positive_weight=0.7, negative_weight=0.5),
    "cispo": CispoKnobs(low=0.2, high=0.25, unified_mask=True), "kimi15": Kimi15Knobs(tau=0.4),
    "decoupled_ppo": DecoupledPpoKnobs(behaviour_cap=1.5), "clip_cov": ClipCovKnobs(ratio=0.01, lb=0.5, ub=2.0),
    "kl_cov": KlCovKnobs(ratio=0.05, coef=0.5), "gmpo": GmpoKnobs(clip_low=0.3, clip_high=0.35),
    "sapo": SapoKnobs(tau_pos=1.5, tau_neg=2.5),
}


@pytest.mark.parametrize("variant", POLICY_LOSSES.names)
def test_loss_spec_carries_every_key_and_the_chosen_variants_knobs(variant):
    assert set(VARIANTS) == {n for n in POLICY_LOSSES.names if POLICY_LOSSES.get(n).knobs is not None}
    assert set(SHARED) == set(_keys(PolicyLossSpec)) - {"variant", "ratio_level"}  # sequence needs ppo
    assert set(KL) == {k for k in _keys(KLSpec) if not k.startswith(("reward", "target", "horizon"))}
    knobs = [f"algorithm.loss.{name}.{f.name}={getattr(values, f.name)}"
             for name, values in VARIANTS.items() for f in dataclasses.fields(values)]
    cfg, _ = stage(f"algorithm.loss.variant={variant}", *(f"algorithm.loss.{k}={v}" for k, v in SHARED.items()),
                   *(f"algorithm.kl.{k}={v}" for k, v in KL.items()), *knobs)
    spec = cfg.algorithm.loss_spec(0.7, "rollout")
    assert spec == PolicyLossSpec(variant=variant, temperature=0.7, old_source="rollout", knobs=VARIANTS.get(variant),
                                  kl=KLSpec(**KL), **SHARED)


def test_advantage_spec_carries_the_chosen_estimators_knobs():
    knobs = ["algorithm.advantage.gae.lam=0.5", "algorithm.advantage.gigpo.step_gamma=0.8",
             "algorithm.advantage.gigpo.episode_weight=0.7", "algorithm.advantage.gigpo.step_weight=0.6",
             "algorithm.advantage.pass_at_k.k=2"]
    for estimator, expected in [("gae", GaeKnobs(lam=0.5)), ("pass_at_k", PassAtKKnobs(k=2)), ("rloo", None)]:
        cfg = load_config(None, ["model.path=m", "data.train_files=[t.jsonl]", f"algorithm.advantage.estimator="
                                 f"{estimator}", "algorithm.advantage.norm_mean=none",
                                 "algorithm.advantage.norm_std=none", *knobs])
        assert cfg.algorithm.advantage.spec().knobs == expected
    cfg = load_config(None, ["model.path=m", "env.id=e", "algorithm.advantage.estimator=gigpo", *knobs])
    assert cfg.algorithm.advantage.spec().knobs == GigpoKnobs(step_gamma=0.8, episode_weight=0.7, step_weight=0.6)


def test_a_spec_checks_its_variants_knobs():
    with pytest.raises(ValueError, match="variant cispo takes CispoKnobs as its knobs, got PpoKnobs"):
        PolicyLossSpec(variant="cispo", knobs=PpoKnobs())
    with pytest.raises(ValueError, match="variant vanilla takes none as its knobs, got TisKnobs"):
        PolicyLossSpec(variant="vanilla", knobs=TisKnobs())
    assert PolicyLossSpec(variant="cispo").knobs == CispoKnobs() and PolicyLossSpec(variant="vanilla").knobs is None


def two_token_batch() -> TrainBatch:
    return TrainBatch(input_ids=torch.tensor([[5, 6, 7]]), attention_mask=torch.ones(1, 3, dtype=torch.long),
                      response_mask=torch.tensor([[0.0, 1.0, 1.0]]), advantages=torch.tensor([[0.0, 1.0, -0.5]]),
                      rollout_logprobs=torch.tensor([[0.0, -1.1, -2.2]]),
                      old_logprobs=torch.tensor([[0.0, -1.0, -2.0]]), ref_logprobs=None, scores=torch.tensor([1.0]))


@pytest.mark.parametrize("name", POLICY_LOSSES.names)
def test_every_policy_loss_is_reachable_from_config(name):
    cfg, _ = stage(f"algorithm.loss.variant={name}")
    loss = PolicyLoss(LossDenominator(tokens=2), cfg.algorithm.loss_spec(1.0, "recomputed"))
    assert loss.variant is POLICY_LOSSES.get(name)
    lp = torch.tensor([[0.0, -0.9, -2.1]], requires_grad=True)
    value = loss(two_token_batch(), lp, None, MetricSums())
    value.backward()
    assert math.isfinite(value.item()) and lp.grad[0, 1:].abs().sum() > 0


def test_unknown_names_are_refused_with_the_valid_ones():
    with pytest.raises(ConfigError, match="algorithm.loss.variant: Input should be 'ppo', 'vanilla', 'tis', 'topr', "
                                          "'cispo', 'kimi15', 'decoupled_ppo', 'clip_cov', 'kl_cov', 'gmpo' or 'sapo'"):
        stage("algorithm.loss.variant=ppo2")
    with pytest.raises(ConfigError, match="algorithm.advantage.estimator: Input should be 'reinforce', 'rloo', "
                                          "'group_centred_batch_std', 'gae', 'step_returns', 'rebn', 'gigpo', "
                                          "'chunk_returns', 'remax', 'opo', 'pass_at_k' or 'gpg'"):
        stage("algorithm.advantage.estimator=grpo")
    # A spec built by hand is checked when the trainer builds its loss, before any batch.
    with pytest.raises(ValueError, match="unknown policy loss 'ppo2'; valid names: ppo, vanilla"):
        PolicyLoss(LossDenominator(tokens=2), PolicyLossSpec(variant="ppo2"))


TOKEN_LEVEL = [n for n in ESTIMATORS.names if ESTIMATORS.get(n).turns is None]
TURN_LEVEL = [n for n in ESTIMATORS.names if ESTIMATORS.get(n).turns is not None]


@pytest.mark.parametrize("name", TOKEN_LEVEL)
def test_every_estimator_is_reachable_from_config(name):
    entry = ESTIMATORS.get(name)
    scopes = [] if entry.scoped else ["algorithm.advantage.norm_mean=none", "algorithm.advantage.norm_std=none"]
    # pass_k=1: with G = 2, k = 2 puts both samples in the one subset, which gives every sample 0.
    cfg, plan = stage(f"algorithm.advantage.estimator={name}", "algorithm.advantage.pass_at_k.k=1", *scopes)
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
    scopes = [] if entry.scoped else ["algorithm.advantage.norm_mean=none", "algorithm.advantage.norm_std=none"]
    cfg = load_config(None, ["model.path=m", "data.train_files=[t.jsonl]", f"algorithm.advantage.estimator={name}",
                             *scopes])
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
    with pytest.raises(ConfigError, match="kl.reward_coef puts a per-token KL penalty into the token rewards, which "
                                          "estimator=gigpo"):
        stage("algorithm.advantage.estimator=gigpo", "algorithm.kl.reward_coef=0.1")


def test_gigpo_knobs_without_gigpo_are_noted():
    _, plan = stage("algorithm.advantage.gigpo.step_gamma=0.9")
    assert "algorithm.advantage.gigpo.step_gamma: no effect, estimator=reinforce is not gigpo" in plan.notes


def test_knobs_of_another_loss_variant_are_noted():
    # grpo's expansion writes loss.ppo.dual_clip_c; a run that swaps the variant is told it no longer applies.
    _, plan = stage("algorithm.preset=grpo", "algorithm.loss.variant=cispo", "algorithm.loss.tis.high=0.5")
    assert [n for n in plan.notes if "no effect, variant=" in n] == [
        "algorithm.loss.ppo.dual_clip_c: no effect, variant=cispo is not ppo",
        "algorithm.loss.tis.high: no effect, variant=cispo is not tis"]
