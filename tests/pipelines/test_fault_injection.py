"""A run with faults injected at random moments (role processes killed or stopped, the driver killed and
resumed) finishes with the metric stream and final weights of the same run uninterrupted: no step is
lost or repeated, no sample is lost or counted twice (the data position, reward counts and every
metric but timings and fault counters match), and the optimizer state survives (weights match).

The longer drill (20 faults over every role, the reference model included) is
``bench/fault_injection.py``.
"""

from __future__ import annotations

import pytest
import yaml

from gyre.cluster.chaos import Fault, compare_runs, run_drill
from gyre.rollout.ledger import audit
from gyre.tracking.logger import read_jsonl_tolerant

STEPS = 40
DRILL_DEADLINE = pytest.mark.timeout(900)
"""The drills bound themselves (run_drill's timeout_s: 300 s straight, 600 s faulted); pytest's default 300 s
for setup and call together would cut short a slow or loaded machine's drill that is still within them."""


def drill_config(tmp_path, name, model_dir, data, restarts, steps=STEPS):
    cfg = {
        "run": {"name": name, "output_dir": str(tmp_path / name), "steps": steps, "seed": 3, "max_restarts": restarts},
        "model": {"path": str(model_dir)},
        "data": {"train_files": [str(data["train"])], "val_files": [str(data["val"])], "max_val_prompts": 8},
        "rollout": {"devices": [1], "prompts_per_step": 4, "samples_per_prompt": 4, "sampling": {"max_new_tokens": 4}},
        # Two optimizer steps per RL step: old log-probs are recomputed, the LR schedule decays.
        "policy": {"devices": [0], "micro_batch_size": 16, "mini_batch_size": 8, "optimizer": {"lr": 0.001},
                   "scheduler": {"type": "cosine", "warmup_steps": 2}},
        "reward": {"type": "math", "workers": 2, "processes": 1},
        "validation": {"every": 20},
        "checkpoint": {"every": 4},
        "watchdog": {"call_timeout_s": 60, "stall_min_s": 6, "stall_factor": 10},
        "logging": {"progress": False, "trackers": [], "plot": False},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def lockstep_config(tmp_path, name, model_dir, data, restarts):
    """Asynchronous training in lockstep (alpha 1: rollout a step ahead of the policy)."""
    path = drill_config(tmp_path, name, model_dir, data, restarts, steps=16)
    cfg = yaml.safe_load(path.read_text())
    cfg["rollout"].update(async_ratio=1, async_mode="lockstep")
    cfg["validation"]["every"] = 6
    cfg["watchdog"]["call_timeout_s"] = 25  # a stop before a call has a usual duration is found sooner
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def straight(tmp_path_factory, tiny_model_dir, arithmetic_data):
    """The uninterrupted synchronous run the slow drill compares with."""
    root = tmp_path_factory.mktemp("drill")
    run_drill(drill_config(root, "straight", tiny_model_dir, arithmetic_data, 0), [], seed=0, timeout_s=300)
    return root / "straight"


def drill(straight, tmp_path, tiny_model_dir, arithmetic_data, faults, seed, config=drill_config):
    faulted = config(tmp_path, "faulted", tiny_model_dir, arithmetic_data, len(faults))
    report = run_drill(faulted, faults, seed=seed, timeout_s=600)
    assert len(report.injected) == len(faults), report.injected  # each landed in a running run
    problems = compare_runs(straight, tmp_path / "faulted")
    assert not problems, problems[:10]
    assert_ledgers_agree(straight, tmp_path / "faulted")


def assert_ledgers_agree(straight, faulted):
    """The faulted run's ledger accounts for every prompt drawn, and trained what the straight run trained,
    step by step (a killed driver's lines after its checkpoint were cut and written again)."""
    a, b = (read_jsonl_tolerant(run / "ledger.jsonl") for run in (straight, faulted))
    assert audit(b) == [], audit(b)[:10]
    trained = lambda lines: [(x["step"], [g["uid"] for g in x["trained"]]) for x in lines if "trained" in x]  # noqa: E731
    assert trained(a) == trained(b)


@DRILL_DEADLINE
@pytest.mark.slow  # 50-90 s; in the default suite lockstep is covered by the sans-IO property tests
# (tests/rollout/test_lockstep.py), driver resume by the SIGTERM test, engine replacement by the driver tests
def test_faults_at_random_moments_leave_an_async_lockstep_run_unchanged(tmp_path, tiny_model_dir, arithmetic_data):
    """Rollout a step ahead of the policy (lockstep, alpha 1): a stopped rollout engine (replaced in place)
    and a SIGKILLed driver (resumed with the groups generated ahead from its checkpoint) leave the metric
    stream and final weights of the uninterrupted run. (Policy and reward faults, with run recovery:
    the slow drill; reward workers also tests/cluster/test_reward_pool.py.)"""
    (tmp_path / "s").mkdir()
    run_drill(lockstep_config(tmp_path / "s", "straight", tiny_model_dir, arithmetic_data, 0), [], seed=0,
              timeout_s=300)
    faults = [Fault("rollout", "stop"), Fault("driver", "kill")]
    drill(tmp_path / "s" / "straight", tmp_path, tiny_model_dir, arithmetic_data, faults, seed=1,
          config=lockstep_config)


@DRILL_DEADLINE
@pytest.mark.slow
def test_every_kind_of_fault_and_a_killed_driver(straight, tmp_path, tiny_model_dir, arithmetic_data):
    faults = [Fault("rollout", "kill"), Fault("rollout", "stop"), Fault("policy", "kill"),
              Fault("reward_subprocess", "kill"), Fault("reward", "stop"), Fault("driver", "kill")]
    drill(straight, tmp_path, tiny_model_dir, arithmetic_data, faults, seed=2)


@DRILL_DEADLINE
@pytest.mark.slow
def test_a_rollout_engine_killed_in_an_async_run_is_replaced_in_place(tmp_path, tiny_model_dir, arithmetic_data):
    """Asynchronous training (rollout and policy on their own slots): killed rollout engines are replaced
    without rebuilding the run, their samples regenerated on a fresh engine; no prompt is lost."""
    import json

    config = drill_config(tmp_path, "async", tiny_model_dir, arithmetic_data, 2)
    cfg = yaml.safe_load(config.read_text())
    cfg["rollout"]["async_ratio"] = 1
    cfg["validation"]["every"] = 0
    config.write_text(yaml.safe_dump(cfg))
    report = run_drill(config, [Fault("rollout", "kill"), Fault("rollout", "kill")], seed=4, timeout_s=600)
    assert len(report.injected) == 2 and report.driver_starts == 1
    records = [json.loads(line) for line in (tmp_path / "async" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r.get("step", 0) > 0]
    assert [r["step"] for r in train] == list(range(1, STEPS + 1))
    assert train[-1]["fault/rollout_engine_deaths"] + train[-1]["fault/recoveries"] >= 2
    assert train[-1]["fault/rollout_engine_deaths"] >= 1
    assert all(r["staleness/violations"] == 0 for r in train)
    assert audit(read_jsonl_tolerant(tmp_path / "async" / "ledger.jsonl")) == []  # no prompt lost or trained twice

