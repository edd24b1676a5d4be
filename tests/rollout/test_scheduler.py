"""The sans-IO scheduler driven by scripted and random event orders, without engines or Ray."""

import random

import pytest

from gyre.rollout.scheduler import Generate, RolloutScheduler, ScheduleSpec, Score
from gyre.seeding import derive_seed
from gyre.types import GenerationResult, PromptRecord, RewardResult, SamplingParams


def prompts(k, start=0):
    return [PromptRecord(f"p{i}", "q", [1] * (1 + i % 3), "0") for i in range(start, start + k)]


def results_for(command: Generate, version=0):
    return [GenerationResult(r.request_id, i, r.prompt_ids, [7] * (1 + i), "x", [-0.5] * (1 + i), "eos",
                             [version] * (1 + i))
            for r in command.requests for i in range(r.n)]


def spec(n=3, groups=4, alpha=0.0):
    return ScheduleSpec(n, groups, SamplingParams(max_new_tokens=4), run_seed=7, async_ratio=alpha)


def test_admission_builds_seeded_requests_spread_over_engines():
    sched = RolloutScheduler(spec(), engines=2)
    assert sched.capacity(1) == 4
    commands = sched.admit(1, prompts(4))
    assert {c.engine for c in commands} == {0, 1}
    requests = sorted((r for c in commands for r in c.requests), key=lambda r: r.request_id)
    assert [r.request_id for r in requests] == ["train-1-0", "train-1-1", "train-1-2", "train-1-3"]
    assert requests[2].seed == derive_seed(7, "train", 1, 2) and all(r.n == 3 for r in requests)
    assert sched.capacity(1) == 0  # alpha 0: one batch per step


def test_every_group_commits_once_whatever_the_order_of_events():
    """Random interleavings of generation parts and rewards: each admitted group is committed exactly
    once, with its samples in index order, and the batch keeps admission order."""
    for seed in range(30):
        rng = random.Random(seed)
        sched = RolloutScheduler(spec(n=3, groups=5), engines=3)
        pending = [res for c in sched.admit(1, prompts(5)) for res in results_for(c)]
        rng.shuffle(pending)
        unscored = []
        while pending or unscored:
            if pending and (not unscored or rng.random() < 0.6):
                k = rng.randint(1, 4)
                part, pending = pending[:k], pending[k:]
                for cmd in sched.on_generated(part):
                    assert isinstance(cmd, Score)
                    unscored.extend(cmd.trajectories)
            else:
                rng.shuffle(unscored)
                k = rng.randint(1, len(unscored))
                done, unscored = unscored[:k], unscored[k:]
                for t in done:
                    t.reward = RewardResult(1.0)
                sched.on_scored(done)
        assert sched.idle and sched.ready(1)
        batch = sched.take(1)
        assert [g.group_id for g in batch] == [f"train-1-{i}" for i in range(5)]
        assert all([t.sample_index for t in g.trajectories] == [0, 1, 2] for g in batch)
        assert len(sched.buffer) == 0


def test_a_group_commits_only_when_every_sample_is_scored():
    sched = RolloutScheduler(spec(n=2, groups=1), engines=1)
    (cmd,) = sched.admit(1, prompts(1))
    (score,) = sched.on_generated(results_for(cmd))
    first, second = score.trajectories
    first.reward = RewardResult(0.0)
    assert sched.on_scored([first]) == [] and not sched.ready(1)
    second.reward = RewardResult(1.0)
    (group,) = sched.on_scored([second])
    assert group.status == "committed" and sched.ready(1)
    with pytest.raises(ValueError, match="without a reward"):
        sched.on_scored([first.__class__(first.prompt, 0)])


def test_groups_start_at_the_published_version():
    sched = RolloutScheduler(spec(n=1, groups=1), engines=1)
    sched.on_published(3)
    (cmd,) = sched.admit(4, prompts(1))
    (score,) = sched.on_generated(results_for(cmd, version=3))
    score.trajectories[0].reward = RewardResult(1.0)
    (group,) = sched.on_scored(score.trajectories)
    assert group.admitted_version == 3 and group.trajectories[0].weight_version == 3
    assert not sched.ready(5) and sched.ready(4)  # alpha 0: only step 4 (training version 3) may take it
