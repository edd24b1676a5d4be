"""Kill a training process with SIGKILL after a checkpoint, resume it, and compare with an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time

import torch
import yaml

STEPS = 6


def write_config(tmp_path, name, model_dir, data):
    cfg = {
        "run": {"name": name, "output_dir": str(tmp_path / name), "steps": STEPS, "seed": 3},
        "model": {"path": str(model_dir)},
        "rollout": {"devices": [0], "prompts_per_step": 4, "samples_per_prompt": 4, "sampling": {"max_new_tokens": 4}},
        # Two optimizer steps per RL step: old log-probs are recomputed, the LR schedule decays.
        "policy": {"devices": [0], "micro_batch_size": 16, "mini_batch_size": 8, "optimizer": {"lr": 0.001},
                   "scheduler": {"type": "cosine", "warmup_steps": 2}},
        "data": {"train_files": [str(data["train"])], "val_files": [str(data["val"])], "max_val_prompts": 8},
        "validation": {"every": 3},
        "checkpoint": {"every": 2},
        "logging": {"progress": False, "tensorboard": True, "plot": False},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_gyre(config, *args, wait=True):
    cmd = [sys.executable, "-m", "gyre.cli", "train", str(config), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, text=True)
    if wait:
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, out
    return proc


def train_records(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def test_sigkill_then_resume_loses_and_repeats_no_step(tmp_path, tiny_model_dir, arithmetic_data):
    reference = write_config(tmp_path, "straight", tiny_model_dir, arithmetic_data)
    run_gyre(reference)

    config = write_config(tmp_path, "killed", tiny_model_dir, arithmetic_data)
    proc = run_gyre(config, wait=False)
    latest = tmp_path / "killed" / "checkpoints" / "latest"
    deadline = time.time() + 180
    while time.time() < deadline and not (latest.exists() and latest.read_text().strip() == "step_000004"):
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and everything it started
    proc.wait()
    steps_before = [r["step"] for r in train_records(tmp_path / "killed") if r["step"] > 0]
    assert steps_before[-1] < STEPS  # it really died mid-run

    run_gyre(config, "--resume")
    resumed = train_records(tmp_path / "killed")
    straight = train_records(tmp_path / "straight")
    assert [r["step"] for r in resumed] == list(range(0, STEPS + 1))  # step 0: validation before training
    # Same seed, same data position, same optimizer state: the resumed run continues the same stream.
    assert resumed[0] == {**straight[0], "time": resumed[0]["time"]}  # validation before training
    for a, b in zip(resumed[1:], straight[1:]):
        assert a["weight_version"] == b["weight_version"]
        assert abs(a["reward/mean"] - b["reward/mean"]) < 1e-9, a["step"]
        assert abs(a["pg_loss"] - b["pg_loss"]) < 1e-4, a["step"]
        assert a["lr"] == b["lr"], a["step"]
        assert a.get("val/accuracy") == b.get("val/accuracy"), a["step"]
    # The final weights match the uninterrupted run's.
    from safetensors.torch import load_file

    final = load_file(tmp_path / "killed" / "final_model" / "model.safetensors")
    expected = load_file(tmp_path / "straight" / "final_model" / "model.safetensors")
    assert final.keys() == expected.keys()
    for name in final:
        assert torch.allclose(final[name], expected[name], atol=1e-5), name
