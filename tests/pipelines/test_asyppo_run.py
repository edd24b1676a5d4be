"""AsyPPO end to end on the quickstart task (2-digit addition, tiny model, local Ray): two critic roles
train on disjoint halves of every batch, and their disagreement masks advantages and the entropy term."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from gyre.app import launch
from gyre.cluster.chaos import compare_runs
from gyre.config import load_config
from gyre.training.learner import Learner


def asyppo_config(tmp_path, model_dir, data, *extra):
    reward = Path(__file__).with_name("reward_fns.py")
    return load_config(None, [
        f"run.output_dir={tmp_path / 'run'}", "run.steps=2", "run.seed=3", "run.max_restarts=0",
        f"model.path={model_dir}", f"data.train_files=[{data['train']}]",
        "rollout.mode=hybrid", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4",
        "rollout.sampling.max_new_tokens=4", "policy.micro_batch_size=8", "policy.optimizer.lr=0.001",
        "algorithm.preset=asyppo", "algorithm.kl.reward_coef=0", "critic.micro_batch_size=8",
        "critic.optimizer.lr=0.001", "validation.every=0", "reward.type=function",
        f"reward.function={reward}:digit_fraction", "logging.progress=false", "logging.trackers=[]",
        "logging.plot=false", *extra])


@pytest.mark.slow  # make test-all (CI time): tests/algos and tests/engines keep the masks and the loss
def test_two_critics_train_on_disjoint_rows_and_their_disagreement_masks(ray_local, tiny_model_dir, arithmetic_data,
                                                                         tmp_path, monkeypatch):
    batches, shares = [], []
    update, train_one = Learner.update, Learner._train_one_critic

    def record_update(self, batch, step):  # the batch as the advantage stage left it
        batches.append(batch)
        return update(self, batch, step)

    def record_share(self, name, batch, step):
        shares.append((name, batch))
        return train_one(self, name, batch, step)

    monkeypatch.setattr(Learner, "update", record_update)
    monkeypatch.setattr(Learner, "_train_one_critic", record_share)
    launch.train(asyppo_config(tmp_path, tiny_model_dir, arithmetic_data, "checkpoint.every=2"), echo=lambda s: None)

    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        for key in ("critic/0/value_loss", "critic/1/value_loss", "critic/0/grad_norm", "critic/1/grad_norm",
                    "critic/value_loss", "asyppo/sigma_mean", "pg_loss", "entropy"):
            assert math.isfinite(r[key]), key
        assert r["asyppo/sigma_mean"] > 0  # separately seeded heads, separately trained: the critics differ
    assert [name for name, _ in shares] == ["critic.0", "critic.1"] * 2
    for step, batch in enumerate(batches):
        # group_response_split: rows are 2 prompts x 4 responses; each critic gets 2 responses of each prompt.
        assert batch.critic_index.tolist() == [0, 1, 0, 1, 0, 1, 0, 1]
        for m in range(2):
            name, share = shares[2 * step + m]
            mine = batch.critic_index == m
            assert torch.equal(share.input_ids, batch.input_ids[mine])  # its rows, and no other's
            assert torch.equal(share.values, batch.critic_values[mine, m])  # clipped around its own old values
        assert torch.allclose(batch.values, batch.critic_values.mean(dim=1))  # GAE on the mean value
        valid = batch.response_mask.bool()
        n = int(valid.sum())
        sigma = batch.critic_values.std(dim=1, correction=0)
        filtered = valid & (batch.entropy_mask == 0)
        assert int(filtered.sum()) == math.ceil(0.2 * n)  # I^H: the highest 20% of sigma
        assert sigma[filtered].min() >= sigma[valid & (batch.entropy_mask == 1)].max()
        masked = valid & (batch.advantages == 0)
        assert int(masked.sum()) >= math.ceil(0.2 * n)  # I^A: at least the lowest 20% of sigma
        assert records[step]["asyppo/adv_masked_frac"] == math.ceil(0.2 * n) / n
        assert records[step]["asyppo/entropy_filtered_frac"] == math.ceil(0.2 * n) / n
    checkpoint = tmp_path / "run" / "checkpoints" / "step_000002"
    assert (checkpoint / "critic.0").is_dir() and (checkpoint / "critic.1").is_dir()


@pytest.mark.slow  # about 30 s on an idle machine: a 2-step run and a resumed copy of its second step
def test_two_critics_resume_exactly(ray_local, tiny_model_dir, arithmetic_data, tmp_path):
    """Both critics' weights, optimizers and schedules come back from the checkpoint: step 2 and the final
    model of a run resumed from step 1 are the uninterrupted run's."""
    launch.train(asyppo_config(tmp_path, tiny_model_dir, arithmetic_data, "checkpoint.every=1"), echo=lambda s: None)
    out, again = tmp_path / "run", tmp_path / "again"
    shutil.copytree(out, again)
    shutil.rmtree(again / "checkpoints" / "step_000002")
    launch.train(asyppo_config(tmp_path, tiny_model_dir, arithmetic_data, "checkpoint.every=1",
                               f"run.output_dir={again}"), mode="resume", echo=lambda s: None)
    assert compare_runs(out, again) == []
