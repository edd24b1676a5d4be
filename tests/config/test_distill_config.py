"""On-policy distillation in the config: the opd preset, the teacher role in the plan and report, and the
combinations refused before anything runs."""

import pytest

from gyre.config import ConfigError, load_config, make_plan
from gyre.config.report import format_plan

BASE = ["model.path=m", "data.train_files=[t.jsonl]"]


def cfg_for(*overrides):
    return load_config(None, BASE + list(overrides))


def test_opd_preset_is_pure_distillation_with_discount_zero():
    a = cfg_for("algorithm=opd", "teacher.model_path=t").algorithm
    assert (a.distill.mode, a.distill.coef, a.advantage.gamma, a.advantage.estimator) == ("pure", 1.0, 0.0, "reinforce")
    assert (a.advantage.norm_mean, a.advantage.norm_std, a.loss.ppo.dual_clip_c) == ("none", "none", None)
    assert a.uses_teacher and not a.uses_reference


def test_the_teacher_is_a_role_placed_and_time_shared_like_the_reference():
    cfg = cfg_for("algorithm=opd", "teacher.model_path=/models/teacher", "teacher.devices=[0]",
                  "teacher.micro_batch_size=4")
    plan = make_plan(cfg, "cpu", 2)
    assert plan.use_teacher and plan.roles["teacher"] == (0,)
    assert ("policy", "teacher") in plan.shared_devices
    report = format_plan(cfg, plan)
    assert "  teacher    devices [0]  (1 worker(s))" in report
    assert "teacher model        /models/teacher, on devices [0]; distill.mode pure, distill.coef 1" in report
    assert "memory (teacher)     micro-batches <= 4 rows" in report
    assert "each token's advantage is -1 x (log pi_student - log pi_teacher)" in report


def test_without_distillation_there_is_no_teacher():
    cfg = cfg_for("teacher.model_path=/models/teacher")
    plan = make_plan(cfg, "cpu", 2)
    assert not plan.use_teacher and "teacher" not in plan.roles
    assert "teacher model        no (no distillation)" in format_plan(cfg, plan)
    assert "algorithm.distill.mode: no effect" in "\n".join(make_plan(cfg_for("algorithm.distill.mode=loss"),
                                                                        "cpu", 2).notes)


def test_distilling_needs_a_teacher_model():
    with pytest.raises(ConfigError, match="teacher.model_path is not set"):
        make_plan(cfg_for("algorithm=opd"), "cpu", 2)


@pytest.mark.parametrize("extra,match", [
    (["algorithm.advantage.estimator=gae"], "estimator=gae would compute advantages that are thrown away"),
    (["algorithm.kl.reward_coef=0.1"], "kl.reward_coef has no effect"),
])
def test_pure_distillation_refuses_knobs_it_would_ignore(extra, match):
    with pytest.raises(ConfigError, match=match):
        cfg_for("algorithm.preset=opd", "teacher.model_path=t", *extra)


def test_loss_mode_puts_the_coefficient_in_the_trainer_spec_and_advantage_mode_does_not():
    loss = cfg_for("algorithm.preset=grpo", "algorithm.distill.coef=0.5", "algorithm.distill.mode=loss").algorithm
    assert loss.loss_spec(1.0, "current").distill_loss_coef == 0.5
    adv = cfg_for("algorithm.preset=grpo", "algorithm.distill.coef=0.5", "algorithm.distill.mode=advantage").algorithm
    assert adv.loss_spec(1.0, "current").distill_loss_coef == 0.0
