"""Algorithm presets expand to explicit knobs; overrides win; combinations that make no sense fail early."""

import pytest
import yaml

from gyre.config import ConfigError, aliases, load_config, make_plan, validate_config
from gyre.config.presets import PRESETS, leaves, value_at
from gyre.config.report import format_plan, resolved_yaml

BASE = ["model.path=m", "data.train_files=[t.jsonl]"]


def cfg_for(*overrides):
    return load_config(None, BASE + list(overrides))


def plan_for(*overrides, devices=4):
    return make_plan(cfg_for(*overrides), "cpu", devices)


def test_the_issue_presets_exist():
    wanted = {"grpo", "dr_grpo", "dapo", "lite_ppo", "ppo", "reinforce_pp", "rloo", "gspo", "cispo", "topr"}
    assert wanted <= set(PRESETS)


# Keys a preset's run needs beyond BASE (opd distils from a teacher model).
PRESET_NEEDS = {"opd": ["teacher.model_path=t"]}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_plans_and_round_trips(name):
    cfg = cfg_for(f"algorithm.preset={name}", *PRESET_NEEDS.get(name, ()))
    for key, value in leaves(PRESETS[name]):
        assert value_at(cfg.algorithm, key) == value, key
    plan = make_plan(cfg, "cpu", 4)
    assert f"algorithm preset {name!r} expands to" in format_plan(cfg, plan)
    # The resolved YAML (preset + every explicit knob) loads back to the same config.
    assert validate_config(yaml.safe_load(resolved_yaml(cfg))) == cfg


def test_shorthand_and_overrides():
    cfg = load_config(None, BASE + ["algorithm=lite_ppo"])
    a = cfg.algorithm
    assert (a.advantage.norm_mean, a.advantage.norm_std, a.loss.agg) == ("group", "batch", "token-mean")
    cfg = cfg_for("algorithm.preset=dapo", "algorithm.loss.clip_high=0.32")
    assert cfg.algorithm.loss.clip_high == 0.32 and cfg.algorithm.masks.overlong
    report = format_plan(cfg, make_plan(cfg, "cpu", 4))
    assert "clip_high" in report and "(overridden: 0.32)" in report


def test_the_renamed_estimator_says_where_its_two_meanings_went():
    scopes = ["algorithm.advantage.norm_mean=none", "algorithm.advantage.norm_std=none"]
    for key in ("algorithm.advantage.estimator", "algorithm.estimator"):  # the earlier flat key too
        with pytest.raises(ConfigError, match="algorithm.advantage.estimator=reinforce_pp_baseline was renamed "
                                              "group_centred_batch_std .*algorithm.preset=reinforce_pp_baseline"):
            cfg_for(f"{key}=reinforce_pp_baseline", *scopes)
    cfg = cfg_for("algorithm.advantage.estimator=group_centred_batch_std", *scopes)
    assert cfg.algorithm.advantage.row.groups


def test_unknown_preset_names_the_closest():
    with pytest.raises(ConfigError, match="unknown algorithm preset 'lite_pp'; did you mean 'lite_ppo'"):
        cfg_for("algorithm.preset=lite_pp")


def test_misspelt_knob_names_the_closest():
    with pytest.raises(ConfigError, match="did you mean 'algorithm.kl.loss_coef'"):
        cfg_for("algorithm.kl.los_coef=0.1")
    with pytest.raises(ConfigError, match="did you mean 'algorithm.kl.loss_coef'"):  # the earlier key, misspelt
        cfg_for("algorithm.kl_los_coef=0.1")


@pytest.mark.parametrize("overrides,message", [
    (["algorithm.preset=rloo", "algorithm.advantage.norm_mean=group"], "computes its own baseline"),
    (["algorithm.loss.variant=cispo", "algorithm.loss.ratio_level=sequence"], "ratio_level=sequence"),
    (["algorithm.kl.target=0.1"], "kl.target adapts the KL reward penalty, which is off"),
    (["algorithm.loss.agg_norm=100"], "loss.agg_norm is the constant of seq-mean-token-sum-norm"),
    (["algorithm.loss.variant=decoupled_ppo", "algorithm.old_logprobs=rollout"], "cannot be the sampler's"),
    (["algorithm.mismatch.weight=token", "algorithm.old_logprobs=rollout"], "cannot be the sampler's"),
    (["algorithm.masks.difficulty=[0.5, 0.5]"], "keeps nothing"),
    (["algorithm.loss.ppo.dual_clip_c=1.0"], "greater than 1"),
])
def test_nonsense_combinations_are_rejected(overrides, message):
    with pytest.raises(ConfigError, match=message):
        cfg_for(*overrides)


def test_group_normalisation_needs_a_group():
    with pytest.raises(ConfigError, match="compares the samples of each prompt.*samples_per_prompt must be >= 2"):
        plan_for("rollout.samples_per_prompt=1")  # the default norm is per group (GRPO)
    with pytest.raises(ConfigError, match="estimator=rloo"):
        plan_for("algorithm=rloo", "rollout.samples_per_prompt=1")
    # Batch-level estimators work with one sample per prompt.
    assert plan_for("algorithm=reinforce_pp", "rollout.samples_per_prompt=1").rollout_batch == 8
    assert plan_for("algorithm=ppo", "rollout.samples_per_prompt=1").use_critic


def test_derived_activations_are_reported():
    plan = plan_for("algorithm=ppo", "critic.devices=[2,3]", "policy.devices=[0,1]", "rollout.devices=[0,1]")
    assert plan.use_critic and plan.critic_dp_size == 2 and plan.roles["critic"] == (2, 3)
    assert plan.use_reference  # the ppo preset's KL reward penalty needs the reference
    plan = plan_for("algorithm.mismatch.filter=sequence")
    assert plan.recompute_old_logprobs and any("mismatch" in n for n in plan.notes)
    plan = plan_for("algorithm=dr_grpo", "rollout.sampling.max_new_tokens=64")
    assert plan.loss_agg_norm == 64
    plan = plan_for("algorithm=dapo", "rollout.sampling.max_new_tokens=100")
    assert plan.overlong_cache_tokens == 20


def test_critic_ranks_must_divide_the_mini_batch():
    with pytest.raises(ConfigError, match="divisible by the 3 critic devices"):
        plan_for("algorithm=ppo", "critic.devices=[0,1,2]")


EARLIER_KEYS = """\
algorithm:
  preset: dapo
  clip_high: 0.3
  cispo_low: 0.25
  lam: 0.9
  critic_warmup: 2
  kl_loss_coef: 0.01
"""


def test_earlier_flat_keys_load_at_their_new_place_with_one_notice_each(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(aliases, "_ANNOUNCED", set())
    path = tmp_path / "earlier.yaml"
    path.write_text(EARLIER_KEYS)
    old = load_config(path, BASE + ["algorithm.gigpo_step_weight=0.5"])
    # Written over the preset as the new keys would be: dapo's clip_low and masks stay.
    assert old == cfg_for("algorithm.preset=dapo", "algorithm.loss.clip_high=0.3", "algorithm.loss.cispo.low=0.25",
                          "algorithm.advantage.gae.lam=0.9", "algorithm.critic.warmup=2", "algorithm.kl.loss_coef=0.01",
                          "algorithm.advantage.gigpo.step_weight=0.5")
    assert (old.algorithm.loss.clip_low, old.algorithm.loss.clip_high, old.algorithm.masks.overlong) == (0.2, 0.3, True)
    moves = [("clip_high", "loss.clip_high"), ("cispo_low", "loss.cispo.low"), ("lam", "advantage.gae.lam"),
             ("critic_warmup", "critic.warmup"), ("kl_loss_coef", "kl.loss_coef"),
             ("gigpo_step_weight", "advantage.gigpo.step_weight")]
    assert capsys.readouterr().err.splitlines() == [
        f"note: config key algorithm.{a} -> algorithm.{b} (renamed; write the new key, the old one still loads)"
        for a, b in moves]
    assert load_config(path, BASE) and capsys.readouterr().err == ""  # once per key and process
    with pytest.raises(ConfigError, match="algorithm: algorithm.clip_high was renamed algorithm.loss.clip_high, and "
                                          "both are written: keep algorithm.loss.clip_high"):
        cfg_for("algorithm.clip_high=0.3", "algorithm.loss.clip_high=0.2")
