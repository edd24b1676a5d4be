"""Attention-based credit through Ray: the policy ranks run the eager-attention pass over each batch and
the advantage stage scales the selected tokens' non-negative advantages."""

import json
import math
from pathlib import Path

import pytest

from gyre.app import launch
from gyre.config import load_config


@pytest.mark.slow  # make test-all; the attention pass and the stage are tested without Ray
def test_coupled_credit_scales_a_share_of_the_tokens(ray_local, tiny_model_dir, arithmetic_data, tmp_path):
    reward = Path(__file__).with_name("reward_fns.py")
    cfg = load_config(None, [
        f"run.output_dir={tmp_path / 'run'}", "run.seed=2", "run.steps=2", "run.max_restarts=0",
        f"model.path={tiny_model_dir}", f"data.train_files=[{arithmetic_data['train']}]", "rollout.devices=[1]",
        "rollout.prompts_per_step=4", "rollout.samples_per_prompt=2", "rollout.sampling.max_new_tokens=8",
        "policy.devices=[0]", "policy.micro_batch_size=4", "algorithm.preset=grpo", "algorithm.credit.strategy=coupled",
        "algorithm.credit.fai_near=1", "algorithm.credit.fai_far=4", "reward.type=function",
        f"reward.function={reward}:digit_fraction", "logging.progress=false", "logging.trackers=[]",
        "logging.plot=false"])
    launch.train(cfg, echo=lambda s: None)
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    train = [r for r in map(json.loads, lines) if r["step"] > 0]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        # ceil(0.4 n) of each response's n tokens are anchors; a dominated one also lifts its WAAD peak.
        assert 0.3 < r["credit/amplified_frac"] < 0.8, r["credit/amplified_frac"]
        assert math.isfinite(r["pg_loss"])
