"""The driver's advantage stage on hand-made groups of trajectories: order of operations, masks, KL penalty, GAE."""

import pytest
import torch

from gyre.config import load_config, make_plan
from gyre.data.batching import collate_groups
from gyre.training.advantage import AlgorithmState, correct_mismatch, estimate_advantages
from gyre.types import Group, PromptRecord, RewardResult, Segment, Trajectory

NO_NORM = ("algorithm.advantage.norm_mean=none", "algorithm.advantage.norm_std=none")


def stage(*overrides, n=2, max_new=4):
    cfg = load_config(None, ["model.path=m", "data.train_files=[t.jsonl]", f"rollout.samples_per_prompt={n}",
                             f"rollout.sampling.max_new_tokens={max_new}", *overrides])
    return cfg, make_plan(cfg, "cpu", 4)


def sample(group, index, score, length, finish="eos", tag=None):
    prompt = PromptRecord(f"p{group}", "q", [1, 2], "0", tag)
    return Trajectory(prompt, index, [Segment([5] * length, [-1.0] * length, 0)], "x", finish, RewardResult(score),
                      "scored")


def groups_of(samples):
    """Trajectories grouped by their prompt, in order of first appearance."""
    groups: dict[str, Group] = {}
    for t in samples:
        groups.setdefault(t.prompt.uid, Group(t.prompt.uid, t.prompt, 0, 0, 0)).trajectories.append(t)
    return list(groups.values())


def to_batch(samples, pad_id):
    return collate_groups(groups_of(samples), pad_id)[0]


def run(cfg, plan, samples, n, batch=None, state=None, keep=None):
    batch = batch if batch is not None else to_batch(samples, 0)
    state = state or AlgorithmState.create(cfg.algorithm)
    metrics = estimate_advantages(batch, groups_of(samples), cfg.algorithm, plan, state,
                                  cfg.rollout.sampling.max_new_tokens, keep)
    return batch, metrics, state


def test_grpo_with_overlong_and_difficulty_masks():
    cfg, plan = stage("algorithm.masks.overlong=true", "algorithm.masks.difficulty=[0, 1]")
    samples = [sample(0, 0, 1.0, 2), sample(0, 1, 0.0, 4, "length"), sample(1, 0, 1.0, 3), sample(1, 1, 1.0, 1)]
    batch, metrics, _ = run(cfg, plan, samples, 2)
    # Group 0: rewards [1, 0], mean 0.5, std 0.7071 (ddof 1) -> advantages 0.5 / 0.7071 = +-0.7071. Sample 1 was
    # truncated (overlong mask); group 1 has no reward variance (difficulty mask): only sample 0 trains.
    assert batch.response_mask.sum(dim=1).tolist() == [2.0, 0.0, 0.0, 0.0]
    assert batch.advantages[0, 2:4].tolist() == pytest.approx([0.70711, 0.70711], abs=1e-5)
    assert batch.advantages[1:].abs().sum() == 0
    assert metrics["mask/overlong_frac"] == 0.25 and metrics["mask/difficulty_frac"] == 0.5
    assert metrics["mask/kept_frac"] == 0.25


def test_kl_penalty_in_the_reward_then_returns():
    # Reference example: r = [0, 0, 1], beta 0.1, k1 = [0.2, -0.1, 0.3] -> r' = [-0.02, 0.01, 0.97],
    # returns (gamma 1) = [0.96, 0.98, 0.97]. One sample per prompt: batch-level estimator, no normalisation.
    cfg, plan = stage(*NO_NORM, "algorithm.kl.reward_coef=0.1", n=1)
    samples = [sample(0, 0, 1.0, 3)]
    batch = to_batch(samples, 0)
    batch.old_logprobs = torch.tensor([[0.0, 0.0, -1.0, -1.0, -1.0]])
    batch.ref_logprobs = batch.old_logprobs - torch.tensor([[0.0, 0.0, 0.2, -0.1, 0.3]])
    batch, metrics, state = run(cfg, plan, samples, 1, batch)
    assert batch.advantages[0, 2:].tolist() == pytest.approx([0.96, 0.98, 0.97], abs=1e-6)
    assert metrics["kl_reward/kl"] == pytest.approx(0.4 / 3) and metrics["kl_reward/coef"] == 0.1


def test_gae_with_critic_values():
    # Reference example: r = [0, 0, 1], V = [0.5, 0.6, 0.7], gamma 1, lambda 0.95 -> A = [0.46575, 0.385, 0.3],
    # returns [0.96575, 0.985, 1.0].
    cfg, plan = stage("algorithm.advantage.estimator=gae", *NO_NORM, n=1)
    samples = [sample(0, 0, 1.0, 3)]
    batch = to_batch(samples, 0)
    batch.values = torch.tensor([[0.0, 0.0, 0.5, 0.6, 0.7]])
    batch, metrics, _ = run(cfg, plan, samples, 1, batch)
    assert batch.advantages[0, 2:].tolist() == pytest.approx([0.46575, 0.385, 0.3], abs=1e-6)
    assert batch.returns[0, 2:].tolist() == pytest.approx([0.96575, 0.985, 1.0], abs=1e-6)
    assert "critic/explained_variance" in metrics


def test_soft_overlong_penalty_enters_the_reward():
    # max_new_tokens 10, L_cache = 0.2 x 10 = 2: a 9-token answer gets (8 - 9) / 2 = -0.5 added.
    cfg, plan = stage("algorithm.masks.overlong_penalty_frac=0.2", *NO_NORM,
                      n=1, max_new=10)
    samples = [sample(0, 0, 1.0, 9), sample(1, 0, 1.0, 8)]
    batch, metrics, _ = run(cfg, plan, samples, 1)
    assert batch.scores.tolist() == [0.5, 1.0]
    assert batch.advantages[0, 2:11].tolist() == pytest.approx([0.5] * 9)


def test_running_moments_are_kept_per_tag_and_checkpointed():
    cfg, plan = stage("algorithm.advantage.norm_mean=running", "algorithm.advantage.norm_std=none")
    samples = [sample(0, 0, 1.0, 1, tag="math"), sample(0, 1, 0.0, 1, tag="math"),
               sample(1, 0, 4.0, 1, tag="code"), sample(1, 1, 2.0, 1, tag="code")]
    batch, _, state = run(cfg, plan, samples, 2)
    # Each tag is centred on its own running mean: math 0.5, code 3.0.
    assert batch.advantages[:, 2].tolist() == pytest.approx([0.5, -0.5, 1.0, -1.0])
    restored = AlgorithmState.create(cfg.algorithm)
    restored.load_dict(state.to_dict())
    assert restored.running["code"].mean == pytest.approx(3.0) and restored.running["math"].count == 2


def test_mismatch_filter_drops_tokens_and_weights_the_rest():
    cfg, plan = stage("algorithm.mismatch.weight=token", "algorithm.mismatch.filter=token")
    samples = [sample(0, 0, 1.0, 2), sample(0, 1, 0.0, 2)]
    batch = to_batch(samples, 0)
    batch.old_logprobs = batch.rollout_logprobs.clone()
    batch.old_logprobs[0, 3] += 0.5  # ratio e^0.5 = 1.65 > 1.2: filtered; weight capped at 1.2
    keep, metrics = correct_mismatch(batch, cfg.algorithm.mismatch)
    assert keep[0].tolist() == [0.0, 0.0, 1.0, 0.0] and metrics["mismatch/filtered_frac"] == 0.25  # prompt: 0
    assert batch.token_weights[0, 3].item() == pytest.approx(1.2)
    batch, _, _ = run(cfg, plan, samples, 2, batch, keep=keep)
    assert batch.response_mask[0].tolist() == [0.0, 0.0, 1.0, 0.0]


def test_reinforce_pp_normalises_the_returns_over_tokens_after_the_kl_penalty():
    # REINFORCE++ (arXiv 2501.03262), one sample per prompt, beta 0.1 (the preset's 0.01 overridden for
    # visible numbers), k1 KL per token:
    # A: score 1, 2 tokens, k1 [0.2, -0.1] -> r' = [-0.02, 1 + 0.01] -> returns [0.99, 1.01]
    # B: score 0, 3 tokens, k1 [0.1, 0.3, -0.2] -> r' = [-0.01, -0.03, 0.02] -> returns [-0.02, -0.01, 0.02]
    # over the 5 tokens: mean 1.99 / 5 = 0.398, deviations [0.592, 0.612, -0.418, -0.408, -0.378],
    # population variance 1.20908 / 5 = 0.241816, std 0.491748 -> deviation / (std + 1e-6).
    cfg, plan = stage("algorithm.preset=reinforce_pp", "algorithm.kl.reward_coef=0.1", n=1)
    samples = [sample(0, 0, 1.0, 2), sample(1, 0, 0.0, 3)]
    batch = to_batch(samples, 0)
    batch.old_logprobs = torch.full((2, 5), -1.0)
    batch.ref_logprobs = batch.old_logprobs - torch.tensor([[0.0, 0.0, 0.2, -0.1, 0.0], [0.0, 0.0, 0.1, 0.3, -0.2]])
    batch, metrics, _ = run(cfg, plan, samples, 1, batch)
    assert batch.advantages[0, 2:4].tolist() == pytest.approx([1.20387, 1.24454], abs=1e-5)
    assert batch.advantages[1, 2:5].tolist() == pytest.approx([-0.85003, -0.82969, -0.76868], abs=1e-5)
    assert batch.advantages[0, 4] == 0 and metrics["advantages/mean"] == pytest.approx(0.0, abs=1e-6)
    # The former preset's order (outcome normalised over responses, then the KL penalty, returns not
    # normalised) stays reachable by its scopes: scores [1, 0] over responses, (1 - 0.5) / 0.70711 (ddof 1)
    # = 0.70711 on A's last token, then r' = [-0.02, 0.70711 + 0.01] and returns [0.69711, 0.71711].
    cfg, plan = stage("algorithm.preset=reinforce_pp", "algorithm.kl.reward_coef=0.1",
                      "algorithm.advantage.norm_mean=batch", "algorithm.advantage.norm_std=batch",
                      "algorithm.advantage.whiten=false", "algorithm.advantage.std_ddof=1", n=1)
    batch, _, _ = run(cfg, plan, samples, 1, batch)
    assert batch.advantages[0, 2:4].tolist() == pytest.approx([0.70711 - 0.02 + 0.01, 0.70711 + 0.01], abs=1e-5)


def test_reinforce_pp_baseline_centres_on_the_group_then_normalises_over_tokens():
    # Group of 2: scores [1, 0], mean 0.5 -> [0.5, -0.5]; lengths 2 and 1, no KL (beta 0 for the arithmetic):
    # returns [0.5, 0.5] and [-0.5]; over 3 tokens mean 1/6, deviations [1/3, 1/3, -2/3], population
    # variance 2/9, std 0.471405 -> [0.70711, 0.70711, -1.41421]. The longer sample weighs twice.
    cfg, plan = stage("algorithm.preset=reinforce_pp_baseline", "algorithm.kl.reward_coef=0")
    samples = [sample(0, 0, 1.0, 2), sample(0, 1, 0.0, 1)]
    batch, _, _ = run(cfg, plan, samples, 2)
    assert batch.advantages[0, 2:4].tolist() == pytest.approx([0.70711, 0.70711], abs=1e-5)
    assert batch.advantages[1, 2].item() == pytest.approx(-1.41421, abs=1e-5)
