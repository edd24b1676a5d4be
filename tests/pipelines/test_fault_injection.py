"""A run with faults injected at random moments (role processes killed or stopped, the driver killed and
resumed) finishes with the metric stream and final weights of the same run uninterrupted.

The longer drill (20 faults over every role) is ``bench/fault_injection.py``.
"""

from __future__ import annotations

import yaml

from gyre.cluster.chaos import Fault, compare_runs, run_drill

STEPS = 10


def drill_config(tmp_path, name, model_dir, data, restarts):
    cfg = {
        "run": {"name": name, "output_dir": str(tmp_path / name), "steps": STEPS, "seed": 3, "max_restarts": restarts},
        "model": {"path": str(model_dir)},
        "data": {"train_files": [str(data["train"])], "val_files": [str(data["val"])], "max_val_prompts": 8},
        "rollout": {"devices": [1], "prompts_per_step": 4, "samples_per_prompt": 4, "sampling": {"max_new_tokens": 4}},
        "policy": {"devices": [0], "micro_batch_size": 16, "optimizer": {"lr": 0.001}},
        "reference": {"devices": [1]},
        "algorithm": {"preset": "grpo"},
        "reward": {"type": "math", "workers": 2, "processes": 1},
        "validation": {"every": 5},
        "checkpoint": {"every": 2},
        "watchdog": {"call_timeout_s": 60, "stall_min_s": 6, "stall_factor": 10},
        "logging": {"progress": False, "tensorboard": False, "plot": False},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_faults_at_random_moments_leave_the_run_unchanged(tmp_path, tiny_model_dir, arithmetic_data):
    straight = drill_config(tmp_path, "straight", tiny_model_dir, arithmetic_data, 0)
    run_drill(straight, [], seed=0, timeout_s=300)
    faults = [Fault("rollout", "kill"), Fault("reward", "kill"), Fault("policy", "stop"),
              Fault("reward_subprocess", "kill"), Fault("driver", "kill"), Fault("reference", "kill")]
    faulted = drill_config(tmp_path, "faulted", tiny_model_dir, arithmetic_data, len(faults))
    report = run_drill(faulted, faults, seed=1, gap_s=(2.0, 4.0), timeout_s=600)
    assert len(report.injected) >= 4, report.injected  # most faults landed before the run ended
    problems = compare_runs(tmp_path / "straight", tmp_path / "faulted")
    assert not problems, problems[:10]
