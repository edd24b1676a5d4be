"""Multi-domain routing and ratio-mixed batches."""

import pytest

from gyre.config import load_config
from gyre.data.domains import DomainSampler, largest_remainder, route_domains
from gyre.data.prompts import DataError
from gyre.types import PromptRecord


def test_largest_remainder_spreads_the_rounding():
    # ROLL's worked example: N = 128 at 0.4/0.3/0.1/0.1/0.1. Floors 51, 38, 12, 12, 12 leave 3; the
    # fractional parts are .2, .4, .8, .8, .8, so the three 0.1 domains get one more each (ROLL: 51, 38,
    # 12, 12 and 15 on the last).
    shares = {"math": 0.4, "code": 0.3, "judge": 0.1, "crossthink": 0.1, "ifeval": 0.1}
    assert largest_remainder(128, shares) == {"math": 51, "code": 38, "judge": 13, "crossthink": 13, "ifeval": 13}
    assert largest_remainder(8, {"a": 0.5, "b": 0.5}) == {"a": 4, "b": 4}
    assert sum(largest_remainder(7, {"a": 0.2, "b": 0.3, "c": 0.5}).values()) == 7


def records(tags):
    return [PromptRecord(f"f.jsonl:{i + 1}", "q", [1], "1", tag) for i, tag in enumerate(tags)]


def reward_cfg(*overrides):
    return load_config(None, ["model.path=m", "data.train_files=[t]", *overrides]).reward


def test_routing_by_tag_and_clear_errors():
    cfg = reward_cfg("reward.domains.math.type=math", "reward.domains.code.type=code",
                     "reward.domains.code.tags=[code, python]")
    recs = records(["math", "python", "code"])
    route_domains(recs, cfg)
    assert [r.domain for r in recs] == ["math", "code", "code"]
    with pytest.raises(DataError, match=r"f.jsonl:2: the prompt has tag 'chat', which no reward domain scores"):
        route_domains(records(["math", "chat"]), cfg)
    with pytest.raises(DataError, match="has no tag"):
        route_domains(records([None]), cfg)
    single = reward_cfg("reward.type=math")
    recs = records(["anything", None])
    route_domains(recs, single)
    assert {r.domain for r in recs} == {"default"}


def test_domain_sampler_mixes_by_ratio_and_resumes():
    recs = records(["math"] * 10 + ["code"] * 3)
    cfg = reward_cfg("reward.domains.math.ratio=0.75", "reward.domains.code.type=code",
                     "reward.domains.code.ratio=0.25")
    route_domains(recs, cfg)
    sampler = DomainSampler(recs, {"math": 0.75, "code": 0.25}, seed=0, shuffle=True)
    batch = sampler.take(8)
    assert [recs[i].domain for i in batch].count("code") == 2  # 25% of 8, even with only 3 code prompts
    state = sampler.state_dict()
    after = sampler.take(8)
    again = DomainSampler(recs, {"math": 0.75, "code": 0.25}, seed=0, shuffle=True)
    again.load_state_dict(state)
    assert again.take(8) == after
    with pytest.raises(DataError, match="have a ratio but no training prompts"):
        DomainSampler(records(["math"]), {"math": 0.5, "code": 0.5}, seed=0, shuffle=True)
