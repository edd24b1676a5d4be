"""Attention-based credit in the config: the algorithm.credit section (derived from CreditSpec), its check
and what gyre check says about it."""

import pytest

from gyre.algos.attention_credit import CreditSpec
from gyre.config import ConfigError, load_config, make_plan
from gyre.config.algorithm_schema import CreditKnobs
from gyre.config.report import format_plan

BASE = ["model.path=m", "data.train_files=[t.jsonl]"]


def test_the_section_is_the_spec_with_every_field_documented():
    assert CreditKnobs().model_dump() == CreditSpec().__dict__
    assert all(f.description for f in CreditKnobs.model_fields.values())
    cfg = load_config(None, BASE + ["algorithm.credit.strategy=coupled", "algorithm.credit.alpha=0.25"])
    assert cfg.algorithm.credit_spec == CreditSpec(strategy="coupled", alpha=0.25)


def test_check_reports_the_credit_and_its_extra_pass():
    cfg = load_config(None, BASE + ["algorithm.credit.strategy=coupled"])
    report = format_plan(cfg, make_plan(cfg, "cpu", 2))
    assert "; credit coupled (gamma 1.5 on the top 40%)" in report
    assert "from one more forward of the policy per step with eager attention" in report
    assert "credit" not in format_plan(load_config(None, BASE), make_plan(load_config(None, BASE), "cpu", 2))


@pytest.mark.parametrize("override,match", [
    ("algorithm.credit.fai_far=5", "fai_far=5 < fai_near=10"),
    ("algorithm.credit.strategy=anchors", "strategy"),
    ("algorithm.credit.top_q=0", "top_q"),
])
def test_bad_credit_knobs_fail_early(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, BASE + [override])
