"""The rollout machine's schedules in real runs (Ray actors, a tiny model): asynchronous training within
its staleness window, tail batching; dynamic sampling with refill, redundancy and queue scheduling (slow)."""

import json
from pathlib import Path

import pytest

from gyre.app import launch
from gyre.rollout.ledger import audit, summary
from gyre.tracking.timeline import read_spans
from tests.pipelines.test_rlvr_integration import quick_config

REWARD = Path(__file__).with_name("reward_fns.py")


def train(tmp_path, tiny_model_dir, arithmetic_data, *overrides):
    cfg = quick_config(tmp_path, tiny_model_dir, arithmetic_data, "validation.every=0", "run.steps=3",
                       "reward.type=function", *overrides)
    launch.train(cfg, echo=lambda s: None)
    return [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


def test_async_training_stays_inside_its_window(ray_local, tiny_model_dir, arithmetic_data, tmp_path):
    records = train(tmp_path, tiny_model_dir, arithmetic_data, f"reward.function={REWARD}:digit_fraction",
                    "rollout.devices=[0]", "policy.devices=[1]", "rollout.async_ratio=1", "policy.mini_batch_size=16")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["staleness/violations"] == 0 for r in records)
    # Step 1 admits 2 batches under version 0; step 2 (training version 1) takes the second: one step stale.
    assert records[0]["staleness/lag_0"] == 1.0 and records[1]["staleness/lag_1"] == 1.0
    assert records[0]["rollout/groups_admitted"] == 8
    # The ledger alone accounts for every prompt drawn (trained, or pending at the end), and its trained
    # groups are the steps' batches.
    ledger = [json.loads(line) for line in (tmp_path / "run" / "ledger.jsonl").read_text().splitlines()]
    assert audit(ledger) == [] and summary(ledger)["trained"] == 3 * 4
    assert [len(line["trained"]) for line in ledger if "trained" in line] == [4, 4, 4]
    assert sum(r["rollout/tokens_trained"] for r in records) == sum(r["batch/response_tokens"] for r in records)
    assert all(r["weight_version"] == r["step"] for r in records)
    assert all(0 <= r["idle/rollout"] <= 1 and 0 <= r["idle/policy"] <= 1 for r in records)
    # The workers' phase spans, taken while the rollout runs on beside the learner's calls. Which step a
    # reward call lands in is timing: a batch may be generated and scored while the previous step trains.
    spans = read_spans(tmp_path / "run" / "timeline.jsonl")
    assert {(s.role, s.rank) for s in spans} == {("driver", 0), ("policy", 0), ("rollout", 0), ("reward", 0)}
    assert {"generate", "reward", "train", "weight_sync"} <= {s.phase for s in spans}
    for step in (1, 2, 3):
        assert {"train", "weight_sync"} <= {s.phase for s in spans if s.step == step}
    decoding = [s for s in spans if s.phase == "generate"]
    training = [s for s in spans if s.phase == "train"]
    assert any(d.start < t.end and t.start < d.end for d in decoding for t in training)  # asynchrony: overlap


@pytest.mark.slow  # make test-all (CI time): tests/rollout/ keeps every tail-batching rule, sans-IO
def test_tail_batching_in_a_synchronous_run(ray_local, tiny_model_dir, arithmetic_data, tmp_path):
    tail = train(tmp_path / "tail", tiny_model_dir, arithmetic_data, f"reward.function={REWARD}:digit_fraction",
                 "rollout.tail_batching={eta_prompts: 1.5, eta_samples: 1.5}", "rollout.mode=hybrid")
    # Short rounds launch 6 prompts x 6 samples and train 4 x 4: two prompts cut per round.
    assert all(r["rollout/groups_admitted"] == 6 or r["rollout/long_round"] == 1 for r in tail)
    assert sum(r.get("rollout/groups_cut", 0) for r in tail) >= 2 and all(r["staleness/lag_0"] == 1 for r in tail)


@pytest.mark.slow
def test_dynamic_sampling_with_redundancy_in_a_queue_scheduled_run(ray_local, tiny_model_dir, arithmetic_data,
                                                                   tmp_path):
    dyn = train(tmp_path / "dyn", tiny_model_dir, arithmetic_data, f"reward.function={REWARD}:uniform_on_even_prompts",
                "rollout.dynamic_sampling={max_draws: 4}", "rollout.schedule=queue", "rollout.redundancy=1")
    assert sum(r.get("rollout/groups_filtered", 0) for r in dyn) > 0
    assert all(r["rollout/groups_admitted"] <= 16 for r in dyn) and all(r["reward/std"] > 0 for r in dyn)
