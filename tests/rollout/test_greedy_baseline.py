"""ReMax's greedy response in the sans-IO scheduler: asked for beside each group at temperature 0, scored, kept
in ``Group.greedy`` (never among the trajectories), and the group commits only once it is scored."""

import random

import pytest

from gyre.rollout.requests import Abort, Generate
from gyre.rollout.scheduler import RolloutScheduler, ScheduleSpec
from gyre.types import GREEDY_SAMPLE, GenerationResult, Group, RewardResult, SamplingParams
from tests.rollout.harness import Source, World

PARAMS = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=4)


def spec(n=3, groups=2, **kw):
    return ScheduleSpec(n, groups, PARAMS, run_seed=7, greedy=True, **kw)


def requests_of(commands):
    return {r.request_id: (c.engine, r) for c in commands if isinstance(c, Generate) for r in c.requests}


@pytest.mark.parametrize("replicate", [False, True])
def test_each_group_asks_for_one_greedy_response(replicate):
    sched = RolloutScheduler(spec(replicate=replicate), engines=2)
    sched.admit(1, Source())
    sent = requests_of(sched.drain())
    for gid in ("train-1-0", "train-1-1"):
        _, greedy = sent[f"{gid}/greedy"]
        assert greedy.n == 1 and greedy.first_sample == GREEDY_SAMPLE
        assert greedy.params == SamplingParams(temperature=0.0, top_p=0.9, max_new_tokens=4)  # only greedy differs
    sampled = [r for rid, (_, r) in sent.items() if not rid.endswith("/greedy")]
    assert sum(r.n for r in sampled) == 6 and all(r.params == PARAMS for r in sampled)


@pytest.mark.parametrize("replicate", [False, True])
def test_the_greedy_response_is_scored_and_kept_apart_whatever_the_order(replicate):
    for seed in range(10):
        world = World(RolloutScheduler(spec(replicate=replicate), engines=3), random.Random(seed))
        batch = world.run_until_ready(1, Source())
        for g in batch:
            assert [t.sample_index for t in g.trajectories] == [0, 1, 2]  # the group: never the greedy one
            assert g.greedy.sample_index == GREEDY_SAMPLE and g.greedy.status == "scored"
            assert g.greedy.reward.score == 1.0  # the harness scores sample i with i % 2: -1 % 2 = 1
        assert world.sched.take_stats()["rollout/greedy_samples"] == 2
        assert world.sched.idle and world.sched.outstanding == 0


def result(request, index, finish="eos"):
    return GenerationResult(request.request_id, index, request.prompt_ids, [5, 6], "ab", [-0.5, -0.5], finish, [0, 0])


def test_a_group_waits_for_its_greedy_score():
    sched = RolloutScheduler(spec(n=2, groups=1), engines=1)
    sched.admit(1, Source())
    sent = requests_of(sched.drain())
    _, sampled = sent["train-1-0"]
    _, greedy = sent["train-1-0/greedy"]
    sched.on_generated([result(sampled, 0), result(sampled, 1)])
    samples = [t for c in sched.drain() for t in c.trajectories]
    for t in samples:
        t.reward = RewardResult(1.0)
    sched.on_scored(samples)
    assert not sched.ready(1)  # every sample is scored, the greedy response is not back
    sched.on_generated([result(greedy, GREEDY_SAMPLE)])
    (score,) = sched.drain()
    assert [t.sample_index for t in score.trajectories] == [GREEDY_SAMPLE]
    assert not sched.ready(1)  # back, not scored yet
    score.trajectories[0].reward = RewardResult(0.5)
    sched.on_scored(score.trajectories)
    (group,) = sched.take(1)
    assert group.greedy.reward.score == 0.5 and len(group.trajectories) == 2


def test_a_dropped_or_lost_greedy_response_is_asked_again_greedily():
    sched = RolloutScheduler(spec(n=2, groups=1), engines=2)
    sched.admit(1, Source())
    sent = requests_of(sched.drain())
    engine, greedy = sent["train-1-0/greedy"]
    sched.on_generated([result(greedy, GREEDY_SAMPLE, "abort")])  # a weight update without partial rollouts
    (again,) = requests_of(sched.drain()).values()
    assert again[1].first_sample == GREEDY_SAMPLE and again[1].params.temperature == 0.0
    sched.on_engine_lost(again[0])
    (third,) = requests_of(sched.drain()).values()
    assert third[1].first_sample == GREEDY_SAMPLE and third[1].params.temperature == 0.0 and third[0] != again[0]


def test_speculative_samples_are_cut_but_the_greedy_response_goes_on():
    # 2 extra samples launched per group: once 2 are accepted the spare ones are aborted, not the greedy request.
    sched = RolloutScheduler(spec(n=2, groups=1, extra_samples=2), engines=1)
    sched.admit(1, Source())
    sent = requests_of(sched.drain())
    _, sampled = sent["train-1-0"]
    sched.on_generated([result(sampled, 0), result(sampled, 1)])
    aborts = [c for c in sched.drain() if isinstance(c, Abort)]
    assert [ids for c in aborts for ids in c.by_engine.values()] == [("train-1-0",)]
    assert "train-1-0/greedy" in sched.requests.live


def test_a_group_with_its_greedy_response_survives_a_checkpoint():
    world = World(RolloutScheduler(spec(n=2, groups=1), engines=1), random.Random(0))
    (group,) = world.run_until_ready(1, Source())
    back = Group.from_dict(group.to_dict())
    assert back == group and back.greedy.prompt is back.prompt
