"""rollout.elastic: a pool that grows and shrinks is checked against the base pool before anything starts,
and ``gyre check`` says what it will do."""

import pytest

from gyre.config import ConfigError, load_config, make_plan
from gyre.config.report import format_plan

BASE = ["model.path=m", "data.train_files=[t.jsonl]", "policy.devices=[0]", "rollout.devices=[1,2]"]


def plan(*overrides):
    cfg = load_config(None, BASE + list(overrides))
    return cfg, make_plan(cfg, "cpu", 4)


def test_check_names_the_base_pool_the_lent_engines_and_the_schedule():
    cfg, p = plan("rollout.elastic={max_engines: 5, notice_s: 10, schedule: [{step: 3, engines: 5}, "
                  "{step: 9, engines: 2}]}")
    assert "rollout.elastic: 2 base engine(s) + up to 3 lent, started outside the run's devices (resources a device " \
           "each); pool sizes step 3: 5, step 9: 2; reclaim with 10 s notice" in format_plan(cfg, p)
    cfg, p = plan("rollout.elastic={max_engines: 2, notice_s: null}")
    assert "pool sizes as the controller asks; reclaim with no notice (samples regenerated)" in format_plan(cfg, p)


@pytest.mark.parametrize("overrides, message", [
    (["rollout.elastic={max_engines: 1}"], "rollout.elastic.max_engines=1 is below the base pool's 2 engines"),
    (["rollout.elastic={max_engines: 4, schedule: [{step: 2, engines: 1}]}"],
     "asks for 1 engines at step 2, below the base pool's 2"),
    (["rollout.mode=hybrid", "rollout.devices=[0]", "rollout.elastic={max_engines: 2}"],
     "rollout.mode=hybrid samples on the policy ranks"),
])
def test_pools_that_cannot_be_built_are_refused_with_the_key_to_change(overrides, message):
    with pytest.raises(ConfigError, match="rollout"):
        plan(*overrides)
    try:
        plan(*overrides)
    except ConfigError as exc:
        assert message in str(exc)


@pytest.mark.parametrize("elastic, message", [
    ("{max_engines: 4, schedule: [{step: 5, engines: 3}, {step: 2, engines: 2}]}", "in increasing order"),
    ("{max_engines: 4, schedule: [{step: 2, engines: 6}]}", "above rollout.elastic.max_engines=4"),
    ("{max_engines: 4, controller: my_ops}", "name it module:function"),
    ("{max_engines: 4, notice: 3}", "notice_s"),
])
def test_the_section_itself_is_strict(elastic, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, BASE + [f"rollout.elastic={elastic}"])
    assert message in str(info.value)
