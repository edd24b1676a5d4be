"""ReMax end to end: real engines generate each prompt's greedy response beside its group, a real reward worker
scores it, and a Ray run uses it as the baseline without training on it."""

import json
from pathlib import Path

import pytest
import torch

from gyre.app import launch
from gyre.cluster.group import RoleGroup
from gyre.cluster.reward_pool import DomainScorer, RewardPool
from gyre.cluster.workers import RewardWorker, RolloutWorker
from gyre.rollout.driver import RolloutDriver
from gyre.rollout.scheduler import RolloutScheduler, ScheduleSpec
from gyre.types import GREEDY_SAMPLE, PromptRecord, SamplingParams
from tests.pipelines.test_rlvr_integration import quick_config
from tests.rollout.test_driver import FNS, engine_args

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=8)


def greedy_batch(engines, rewards, seed):
    pool = RewardPool({"default": DomainScorer("default", rewards)})
    scheduler = RolloutScheduler(ScheduleSpec(3, 2, PARAMS, run_seed=seed, greedy=True), engines=len(engines))
    source = iter([PromptRecord(f"p{i}", "q", [3 + i, 7], "0") for i in range(2)])
    scheduler.admit(1, lambda k: [next(source) for _ in range(k)])
    driver = RolloutDriver(engines, pool, emit_every=2)
    driver.run(scheduler, lambda: scheduler.ready(1))
    groups = scheduler.take(1)
    driver.close()
    return groups, scheduler.take_stats()


def test_engines_generate_and_score_the_greedy_response(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    engines = RoleGroup.local("rollout", RolloutWorker, [engine_args(tiny_model_dir, r) for r in range(2)])
    rewards = RoleGroup.local_unplaced("reward", RewardWorker, 1, (f"{FNS}:length_reward", {}, 10.0, 1))
    first, stats = greedy_batch(engines, rewards, seed=3)
    second, _ = greedy_batch(engines, rewards, seed=4)
    engines.kill()
    rewards.kill()
    assert stats["rollout/greedy_samples"] == 2
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    for g, again in zip(first, second):
        greedy = g.greedy
        assert greedy.sample_index == GREEDY_SAMPLE and [t.sample_index for t in g.trajectories] == [0, 1, 2]
        assert greedy.reward.score == len(greedy.response_text)  # scored by the real reward function
        # Temperature 0: argmax decoding, the same whatever the run's seed, as transformers' greedy search.
        assert greedy.response_ids == again.greedy.response_ids
        with torch.no_grad():
            out = model.generate(torch.tensor([g.prompt.prompt_ids]), do_sample=False, max_new_tokens=8,
                                 pad_token_id=0)
        assert greedy.response_ids == out[0, len(g.prompt.prompt_ids):].tolist()[:len(greedy.response_ids)]
    # The sampled responses do depend on the seed (they are not greedy).
    assert [[t.response_ids for t in g.trajectories] for g in first] != \
        [[t.response_ids for t in g.trajectories] for g in second]


@pytest.mark.slow  # make test-all; the greedy sample's lifecycle is tested in the scheduler without Ray
def test_a_remax_run_baselines_on_the_greedy_response_and_trains_only_the_samples(ray_local, tiny_model_dir,
                                                                                   arithmetic_data, tmp_path):
    reward = Path(__file__).with_name("reward_fns.py")
    cfg = quick_config(tmp_path, tiny_model_dir, arithmetic_data, "run.steps=2", "validation.every=0",
                       "algorithm.preset=remax", "algorithm.kl.reward_coef=0", "rollout.devices=[0]",
                       "policy.devices=[0]", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=2",
                       "policy.mini_batch_size=4", "reward.type=function",
                       f"reward.function={reward}:digit_fraction")
    lines = []
    launch.train(cfg, echo=lines.append)
    assert any("greedy baseline      + 1 greedy sample per prompt" in line for line in lines)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["rollout/greedy_samples"] == 2  # one per prompt: generated
        assert 0.0 <= r["reward/greedy_mean"] <= 1.0  # scored (the digit fraction)
        assert r["batch/rows"] == 4  # 2 prompts x 2 samples: the greedy responses are not trained on
        assert r["grad_norm"] > 0
