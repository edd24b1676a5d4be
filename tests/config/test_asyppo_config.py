"""AsyPPO's config: the preset sets knobs in two sections, several critics plan as roles of their own, and
knob combinations that cannot work fail with the key to change."""

import pytest

from gyre.config import ConfigError, load_config, make_plan
from gyre.config.report import format_plan

BASE = ["model.path=m", "data.train_files=[t.jsonl]"]


def cfg_for(*overrides):
    return load_config(None, BASE + list(overrides))


def test_the_preset_sets_two_critics_and_the_masks():
    cfg = cfg_for("algorithm=asyppo")
    a = cfg.algorithm
    assert cfg.critic.num_critics == 2 and cfg.algorithm.critic.data_division == "group_response_split"
    assert (a.advantage.estimator, a.critic.value_aggregation) == ("gae", "mean")
    assert (a.critic.adv_mask_low_pct, a.critic.entropy_filter_high_pct) == (0.2, 0.2)
    assert a.loss.entropy_coef > 0  # the entropy filter needs a term to act on
    plan = make_plan(cfg, "cpu", 4)
    assert plan.critic_roles == ("critic.0", "critic.1")
    assert plan.roles["critic.0"] == plan.roles["critic.1"] == (0,) and "critic" not in plan.roles
    report = format_plan(cfg, plan)
    assert "2 critics of 1 rank(s) (critic.0, critic.1), each an equal share of every prompt's responses" in report
    assert "critic.num_critics     2" in report and f"{'critic.adv_mask_low_pct':<30} 0.2" in report


def test_the_users_critic_keys_win_over_the_preset():
    cfg = cfg_for("algorithm.preset=asyppo", "critic.num_critics=4", "algorithm.critic.data_division=prompt_shard")
    assert (cfg.critic.num_critics, cfg.algorithm.critic.data_division) == (4, "prompt_shard")
    assert "critic.num_critics     2  (overridden: 4)" in format_plan(cfg, make_plan(cfg, "cpu", 4))


def test_one_critic_is_ppo_unchanged():
    plan = make_plan(cfg_for("algorithm=ppo"), "cpu", 4)
    assert plan.critic_roles == ("critic",) and plan.roles["critic"] == (0,)
    assert make_plan(cfg_for(), "cpu", 4).critic_roles == ()


@pytest.mark.parametrize("overrides,message", [
    (["algorithm.critic.adv_mask_low_pct=0.2"],
     "rank the disagreement of several critics, and estimator=reinforce has none"),
    (["algorithm.preset=ppo", "algorithm.critic.entropy_filter_high_pct=0.2"],
     r"critic.num_critics=1; set critic.num_critics >= 2"),
    (["algorithm=asyppo", "rollout.samples_per_prompt=3"], "rollout.samples_per_prompt=3; make it a multiple"),
    (["algorithm.preset=asyppo", "algorithm.critic.data_division=prompt_shard", "rollout.prompts_per_step=3"],
     "rollout.prompts_per_step=3; make it a multiple"),
    (["algorithm=asyppo", "critic.devices=[0,1]", "policy.mini_batch_size=2", "rollout.prompts_per_step=1",
      "rollout.samples_per_prompt=4"], "divided among 2 critics of 2 rank"),
    (["algorithm.preset=asyppo", "algorithm.critic.adv_mask_low_pct=1.0"], "less than 1"),
])
def test_combinations_that_cannot_work_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        make_plan(cfg_for(*overrides), "cpu", 4)


def test_knobs_without_effect_are_noted():
    plan = make_plan(cfg_for("critic.num_critics=2"), "cpu", 4)
    assert any("critic.num_critics=2: no effect" in n for n in plan.notes) and plan.critic_roles == ()
    plan = make_plan(cfg_for("algorithm.preset=asyppo", "algorithm.loss.entropy_coef=0"), "cpu", 4)
    assert any("entropy_filter_high_pct: no effect" in n for n in plan.notes)
