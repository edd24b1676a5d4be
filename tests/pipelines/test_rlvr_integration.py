"""A few real RL steps through Ray actors: two gloo trainer ranks, one rollout engine, a reward worker."""

import json
import math
import time
from pathlib import Path

import pytest

from gyre.app import launch
from gyre.config import load_config
from gyre.tracking.timeline import read_spans


def quick_config(tmp_path, model_dir, data, *extra):
    return load_config(None, [
        f"run.output_dir={tmp_path / 'run'}", "run.steps=3", "run.seed=1",
        f"model.path={model_dir}",
        f"data.train_files=[{data['train']}]", f"data.val_files=[{data['val']}]", "data.max_val_prompts=16",
        "rollout.devices=[0,1]", "rollout.prompts_per_step=4", "rollout.samples_per_prompt=4",
        "rollout.sampling.max_new_tokens=4",
        "policy.devices=[0,1]", "policy.micro_batch_size=4", "policy.mini_batch_size=8",
        "policy.optimizer.lr=0.001", "validation.every=2", "logging.progress=false", *extra])


def test_three_rl_steps_on_ray(ray_local, tiny_model_dir, arithmetic_data, tmp_path):
    reward = Path(__file__).with_name("reward_fns.py")
    # Every row gets a column of its own, which the reward requires: the run gets through only if the
    # column reaches the reward function. Prompts keep their last 5 tokens ("67+38=" -> "7+38=").
    rows, val = ([json.loads(line) for line in Path(arithmetic_data[name]).read_text().splitlines()]
                 for name in ("train", "val"))
    for name, source in (("train", rows), ("val", val)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({**r, "weight": 1.0}) + "\n" for r in source))
    cfg = quick_config(tmp_path, tiny_model_dir, {"train": tmp_path / "train.jsonl", "val": tmp_path / "val.jsonl"},
                       "algorithm.kl.loss_coef=0.01", "reference.devices=[1]", "policy.offload=always",
                       "reference.remove_padding=sort", "reference.logprob_chunk_tokens=16",
                       "reward.type=function", f"reward.function={reward}:weighted_digit_fraction",
                       "data.max_prompt_tokens=5", "data.overlong_prompts=truncate_left")
    lines = []
    summary = launch.train(cfg, echo=lines.append)
    truncated = sum(len(r["prompt"]) > 5 for r in rows + val)  # one token per character
    assert f"data: {len(rows)} training prompts, 16 held-out prompts ({truncated} truncated" in "\n".join(lines)
    out = tmp_path / "run"
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["step"] > 0]
    assert [r["step"] for r in train] == [1, 2, 3]
    # Weights are re-synced after every step and stamped on the samples of the next one.
    assert [r["weight_version"] for r in train] == [1, 2, 3]
    assert [r["sample_weight_version"] for r in train] == [0, 1, 2]
    assert all(r["staleness/max"] == 0 for r in train)  # synchronous: always on-policy
    for r in train:
        for key in ("pg_loss", "kl_ref", "entropy", "grad_norm", "approx_kl", "clip_frac"):
            assert math.isfinite(r[key]), key
        assert r["kl_ref"] >= 0
        for phase in ("generate", "reward", "logprobs", "train", "weight_sync"):
            assert r[f"time/{phase}"] > 0
    # 2 optimizer steps per RL step (16 samples / mini-batch 8), so old log-probs were recomputed: the
    # second mini-batch sees a ratio != 1 and the policy drifts from the reference.
    assert any(r["reward/std"] > 0 for r in train)
    assert train[-1]["ratio_mean"] != 1.0 and train[-1]["kl_ref"] > 0
    # Validation before training and after steps; a plain float reward judges no correctness: no accuracy.
    assert records[0]["step"] == 0 and "val/reward/mean" in records[0] and "val/accuracy" not in records[0]
    assert "val/reward/positive_frac" in train[1] and "val/reward/mean" in train[2]
    assert summary.first_val_accuracy is None
    assert summary.final_model is not None and (out / "metrics.png").stat().st_size > 0
    # driver.log keeps the data line (said before the run directory was decided) and a line per step.
    log = (out / "driver.log").read_text()
    assert f"({truncated} truncated" in log and "placement" in log
    assert all(f"step {n}/3 reward=" in log for n in (1, 2, 3))
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(summary.final_model).config.vocab_size > 0
    # Every actor and the placement group were released (asynchronously): the next run gets the devices again.
    deadline = time.time() + 20
    total = ray_local.cluster_resources()["CPU"]
    while ray_local.available_resources().get("CPU", 0) < total and time.time() < deadline:
        time.sleep(0.2)
    assert ray_local.available_resources().get("CPU", 0) == pytest.approx(total)


def test_hybrid_rollout_samples_with_the_training_weights(ray_local, tiny_model_dir, arithmetic_data, tmp_path):
    reward = Path(__file__).with_name("reward_fns.py")
    # With the memory levers on: packed token-budget micro-batches and chunked log-probs must still give
    # the sampler's log-probs, and the sampler must get its output layer back after each forward pass.
    cfg = quick_config(tmp_path, tiny_model_dir, arithmetic_data, "rollout.mode=hybrid", "validation.every=0",
                       "reward.type=function", f"reward.function={reward}:digit_fraction",
                       "policy.micro_batch_tokens=48", "policy.remove_padding=pack", "policy.logprob_chunk_tokens=8")
    launch.train(cfg, echo=lambda s: None)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["sample_weight_version"] for r in records] == [0, 1, 2]
    assert [r["weight_version"] for r in records] == [1, 2, 3]
    assert all(r["logprob_mismatch"] < 1e-4 for r in records)  # same weights, same process: same log-probs
    assert "time/weight_sync" in records[0] and records[0]["time/weight_sync"] < 0.5


@pytest.mark.slow  # about 30 s; the DDP hybrid run above keeps hybrid sampling in the default run
def test_hybrid_rollout_under_fsdp2_samples_from_a_gathered_copy(ray_local, tiny_model_dir, arithmetic_data, tmp_path):
    """Two FSDP2 ranks sample from full copies gathered from their shards after each step: the samples'
    log-probs are the trainer's (the copy holds the very weights that trained), the stamps advance."""
    reward = Path(__file__).with_name("reward_fns.py")
    cfg = quick_config(tmp_path, tiny_model_dir, arithmetic_data, "rollout.mode=hybrid", "policy.strategy=fsdp2",
                       "validation.every=0", "reward.type=function", f"reward.function={reward}:digit_fraction")
    lines = []
    launch.train(cfg, echo=lines.append)
    assert any("gathers a full copy" in line for line in lines)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["sample_weight_version"] for r in records] == [0, 1, 2]
    assert all(r["logprob_mismatch"] < 1e-4 for r in records)


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a GPU")
def test_colocated_gpu_run_with_offload(tmp_path, tiny_model_dir, arithmetic_data):
    """On one GPU, policy, rollout and reference time-share it with offload (the auto choice on GPU)."""
    import subprocess
    import sys

    import yaml

    config = tmp_path / "gpu.yaml"
    config.write_text(yaml.safe_dump({
        "run": {"output_dir": str(tmp_path / "run"), "steps": 3},
        "cluster": {"device": "cuda"},
        "model": {"path": str(tiny_model_dir), "dtype": "bfloat16"},
        "data": {"train_files": [str(arithmetic_data["train"])]},
        "rollout": {"devices": [0], "prompts_per_step": 4, "samples_per_prompt": 4, "sampling": {"max_new_tokens": 4}},
        "policy": {"devices": [0], "strategy": "fsdp2", "micro_batch_size": 4, "mini_batch_size": 8},
        "algorithm": {"kl": {"loss_coef": 0.01}},
        "reference": {"devices": [0]},
        "logging": {"progress": False, "trackers": [], "plot": False},
    }))
    proc = subprocess.run([sys.executable, "-m", "gyre.app.cli", "train", str(config)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "time-shared with offload" in proc.stdout
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["weight_version"] for r in records] == [1, 2, 3]


@pytest.mark.slow  # about 40 s; resume is also exercised by the default fault drill and the SIGTERM test
def test_ppo_with_a_critic_role_warms_up_checkpoints_and_resumes(ray_local, tiny_model_dir, arithmetic_data, tmp_path):
    """PPO: a critic (value head on the tiny backbone) trains as its own role; the policy waits one step."""
    reward = Path(__file__).with_name("reward_fns.py")
    args = ["algorithm.preset=ppo", "algorithm.critic.warmup=1", "critic.devices=[0,1]", "critic.micro_batch_size=4",
            "critic.optimizer.lr=0.001", "validation.every=0", "checkpoint.every=1", "reward.type=function",
            f"reward.function={reward}:digit_fraction", "critic.remove_padding=pack", "critic.micro_batch_tokens=64"]
    launch.train(quick_config(tmp_path, tiny_model_dir, arithmetic_data, *args), echo=lambda s: None)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        for key in ("critic/value_loss", "critic/grad_norm", "critic/explained_variance", "returns/mean",
                    "kl_reward/kl", "advantages/std"):
            assert math.isfinite(r[key]), key
    assert "pg_loss" not in records[0] and "pg_loss" in records[1]  # critic warm-up: the policy waits
    assert abs(records[1]["advantages/mean"]) < 1e-5  # whitened advantages
    assert (tmp_path / "run" / "checkpoints" / "step_000003" / "critic").is_dir()
    # Resume the critic, the optimizer and the adaptive-KL state for one more step.
    launch.train(quick_config(tmp_path, tiny_model_dir, arithmetic_data, *args, "run.steps=4"), mode="resume",
                 echo=lambda s: None)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4] and math.isfinite(records[-1]["critic/value_loss"])
    # Every worker's phases, across the resume: the critic ranks score and train, the reference scores.
    spans = read_spans(tmp_path / "run" / "timeline.jsonl")
    assert {("critic", 0, "logprobs"), ("critic", 1, "train"), ("reference", 0, "logprobs")} <= \
        {(s.role, s.rank, s.phase) for s in spans}
    assert sorted({s.step for s in spans}) == [0, 1, 2, 3, 4]


# The step-sample variant runs in make test-all (step rows are tested token by token in tests/envs).
@pytest.mark.parametrize("samples", ["trajectory", pytest.param("step", marks=pytest.mark.slow)])
def test_an_agentic_run_plays_environments_turn_by_turn(ray_local, tiny_model_dir, tmp_path, samples):
    """A multi-turn run on a built-in game: environment workers host the games, episodes are sampled
    turn by turn, the episode return is the reward, and validation plays fixed seeds. Step-level samples
    train one row per turn (with GiGPO), padded to equal shares of two ranks' two mini-batches."""
    mode = ["env.samples=step", "env.history_turns=1", "algorithm.advantage.estimator=gigpo",
            "policy.mini_batch_size=4"] if samples == "step" else []
    cfg = load_config(None, [
        f"run.output_dir={tmp_path / 'run'}", "run.steps=2", "run.seed=1", f"model.path={tiny_model_dir}",
        "env.id=gyre:guess_number", "env.kwargs={low: 1, high: 8}", "env.max_turns=3", "env.turn_tokens=12",
        "env.context_tokens=400", "env.slots_per_worker=8", "env.val_episodes=4", "rollout.devices=[0,1]",
        "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4", "policy.devices=[0,1]",
        "policy.micro_batch_size=4", "validation.every=2", "logging.progress=false", *mode])
    launch.train(cfg)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["step"] > 0]
    assert [r["step"] for r in train] == [1, 2] and "val/accuracy" in records[0] and "val/accuracy" in train[-1]
    for r in train:
        assert r["env/steps"] >= 8 and r["rollout/groups_admitted"] == 2
        rows = r["batch/rows"]
        assert rows == 8 if samples == "trajectory" else (rows >= 8 and rows % 4 == 0)  # a row per turn
        assert -0.1 <= r["reward/mean"] <= 1.0  # a format penalty at worst, a win at best
    # Generations (the last step's, and each validation's) are whole episodes, turn by turn.
    generations = tmp_path / "run" / "generations"
    assert sorted(p.name for p in generations.iterdir()) == ["step_2.jsonl", "val_step_0.jsonl", "val_step_2.jsonl"]
    episodes = [json.loads(line) for line in (generations / "step_2.jsonl").read_text().splitlines()]
    assert len(episodes) == 8  # logging.generations_samples: both groups, all their samples
    for e in episodes:
        roles = [turn["role"] for turn in e["turns"]]
        assert roles[0] == "assistant" and roles == ["assistant", "env"] * (len(roles) // 2) + ["assistant"] * (
            len(roles) % 2) and 1 <= roles.count("assistant") <= 3
        assert e["reward"] == pytest.approx(sum(t["reward"] for t in e["turns"] if t["role"] == "assistant"))
        assert isinstance(e["advantage"], float) and e["response_tokens"] <= 3 * 12
    spans = read_spans(tmp_path / "run" / "timeline.jsonl")  # environment workers record their steps too
    assert {s.phase for s in spans if s.role == "env"} == {"env_step"}
    assert {"rollout", "policy", "driver"} <= {s.role for s in spans}
