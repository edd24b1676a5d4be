"""Elastic rollout capacity: engines that join and leave mid-request lose and duplicate no sample.

The unit tests drive two or three ``SimEngine``s by hand, step by step, around the real scheduler; the
property tests run whole simulated trainings (``gyre.sim.run``) under several on/off plans and seeds and
check every trained group, every drawn prompt and the staleness window.
"""

from __future__ import annotations

import random

import pytest

from gyre.config.catalog import MODELS, device_class
from gyre.rollout.requests import Generate
from gyre.rollout.scheduler import RolloutScheduler, ScheduleSpec, Score
from gyre.sim.cost import CostModel
from gyre.sim.elastic import ElasticSpec
from gyre.sim.engine import SimEngine
from gyre.sim.run import Layout, SimRun, SimSpec
from gyre.sim.workload import Workload, WorkloadSpec
from gyre.types import RewardResult, SamplingParams

COST = CostModel(device_class("h100"), MODELS["7b"])
LENGTHS = {0: 10, 1: 6}
"""Full response length of each sample in the unit tests (the budget, 8, caps sample 0)."""


def _engine(version: int) -> SimEngine:
    engine = SimEngine(COST, lambda request, sample: LENGTHS[sample])
    engine.load_weights(None, version)
    return engine


def _generates(sched: RolloutScheduler) -> list[Generate]:
    return [c for c in sched.drain() if isinstance(c, Generate)]


def _placed(sched: RolloutScheduler) -> tuple[set[int], list]:
    """The engines the scheduler's new requests went to, and the requests (a continuation is asked alone)."""
    commands = _generates(sched)
    return {c.engine for c in commands}, [r for c in commands for r in c.requests]


def _steps(engine: SimEngine, k: int) -> list:
    return [r for _ in range(k) for r in engine.step()]


def _group_of_two(engines: int) -> tuple[RolloutScheduler, SimEngine]:
    """A scheduler asking for one group of two samples; engine 0 (version 0) has decoded 2 tokens of each
    at version 0 and 2 at version 1."""
    sched = RolloutScheduler(ScheduleSpec(2, 1, SamplingParams(max_new_tokens=8)), engines)
    sched.admit(1, lambda k: [Workload(WorkloadSpec()).prompt(i) for i in range(k)])
    (first,) = _generates(sched)
    assert first.engine == 0 and first.requests[0].n == 2
    e0 = _engine(0)
    e0.add(first.requests)
    assert _steps(e0, 2) == []
    e0.update(1)
    assert _steps(e0, 2) == []
    return sched, e0


def _finish(sched: RolloutScheduler, engine: SimEngine, steps: int) -> list:
    """Run ``engine`` ``steps`` steps, hand its samples to the scheduler, score them, take the batch."""
    results = _steps(engine, steps)
    sched.on_generated(results)
    (score,) = [c for c in sched.drain() if isinstance(c, Score)]
    for t in score.trajectories:
        t.reward = RewardResult(1.0)
    sched.on_scored(score.trajectories)
    assert sched.ready(1)
    (group,) = sched.take(1)
    return group.trajectories


def test_handed_back_samples_continue_on_another_engine():
    sched, e0 = _group_of_two(engines=2)
    held = e0.abort(e0.request_ids())
    assert [(r.sample_index, len(r.response_ids), r.offset, list(r.versions)) for r in held] == \
        [(0, 4, 0, [0, 0, 1, 1]), (1, 4, 0, [0, 0, 1, 1])]
    sched.on_engine_lost(0, held)
    assert sched.take_stats()["rollout/samples_continued"] == 2
    engines, again = _placed(sched)
    assert engines == {1}  # nothing goes to the engine that left
    assert [(r.first_sample, r.n, len(r.prefix)) for r in again] == [(0, 1, 4), (1, 1, 4)]
    e1 = _engine(2)
    e1.add(again)
    # sample 1 needs 6 - 4 = 2 more tokens, sample 0 8 - 4 = 4 (its 10 capped by the budget of 8)
    trajectories = _finish(sched, e1, 4)
    assert [(t.sample_index, len(t.response_ids), t.finish_reason) for t in trajectories] == \
        [(0, 8, "length"), (1, 6, "stop")]
    assert [[(s.weight_version, len(s.token_ids)) for s in t.segments] for t in trajectories] == \
        [[(0, 2), (1, 2), (2, 4)], [(0, 2), (1, 2), (2, 2)]]
    assert sched.flights == {} and not sched.requests.live


def test_an_engine_lost_without_hand_back_continues_from_the_parts_handed_back_before():
    sched, e0 = _group_of_two(engines=3)
    sched.on_engine_lost(0, e0.abort(e0.request_ids()))
    engines, second = _placed(sched)
    assert engines == {1, 2} and [(r.first_sample, len(r.prefix)) for r in second] == [(0, 4), (1, 4)]
    e1, e2 = _engine(1), _engine(1)
    e1.add(second[:1])
    e2.add(second[1:])
    assert _steps(e1, 1) == []  # one more token of sample 0, then engine 1 dies: that token is lost
    sched.on_engine_lost(1, ())
    assert sched.take_stats()["rollout/samples_continued"] == 3
    engines, third = _placed(sched)
    assert engines == {2} and [(r.first_sample, len(r.prefix)) for r in third] == [(0, 4)]
    e2.add(third)
    trajectories = _finish(sched, e2, 4)
    assert [len(t.response_ids) for t in trajectories] == [8, 6]
    assert [[(s.weight_version, len(s.token_ids)) for s in t.segments] for t in trajectories] == \
        [[(0, 2), (1, 2), (1, 4)], [(0, 2), (1, 2), (1, 2)]]


def test_a_pool_joins_ranks_in_order():
    sched = RolloutScheduler(ScheduleSpec(2, 1, SamplingParams()), 2)
    sched.on_engine_joined(2)
    assert sched.engines == 3 and len(sched.requests.load) == 3
    with pytest.raises(ValueError):
        sched.on_engine_joined(5)


# ---- whole simulated runs ------------------------------------------------------------------------------
def _spec(seed: int, warning_s: float | None, alpha: float, replicate: bool, partial: bool,
          colocated: bool = False) -> SimSpec:
    sched = ScheduleSpec(4, 8, SamplingParams(max_new_tokens=512), seed, async_ratio=alpha, replicate=replicate)
    layout = Layout(8, 8, 8, True) if colocated else Layout(8, 4, 4, False)
    elastic = ElasticSpec(lent=6, on_s=4.0, off_s=3.0, warning_s=warning_s, seed=seed)
    return SimSpec(sched, layout, COST, WorkloadSpec(prompt_tokens=64, response_tokens=200, max_tokens=512),
                   steps=5, warmup=1, partial=partial, max_rows=8, elastic=elastic, seed=seed)


ABORTS = ("rollout/groups_expired", "rollout/groups_redundant", "rollout/groups_cut", "rollout/groups_failed",
          "rollout/groups_filtered")
"""The counters of every way an admitted group ends without training."""


def _check_run(spec: SimSpec) -> dict[str, float]:
    run = SimRun(spec)
    trained, continued = [], set()
    take, ask_rest = run.scheduler.take, run.scheduler.source._ask_rest

    def recording_take(step):
        groups = take(step)
        trained.extend(groups)
        return groups

    def recording_ask_rest(group, i):
        continued.add((group.group_id, i))
        ask_rest(group, i)

    run.scheduler.take, run.scheduler.source._ask_rest = recording_take, recording_ask_rest
    result = run.run()
    cap, size = spec.schedule.sampling.max_new_tokens, spec.schedule.group_size
    for group in trained:
        assert sorted(t.sample_index for t in group.trajectories) == list(range(size))
        for t in group.trajectories:
            expected = max(1, min(cap, run.workload.response_tokens(group.prompt, t.sample_index)))
            assert len(t.response_ids) == expected, (group.group_id, t.sample_index)
            versions = [s.weight_version for s in t.segments]
            assert versions == sorted(versions) and versions[0] >= group.admitted_version
            if (group.group_id, t.sample_index) in continued:
                assert sum(len(s.token_ids) for s in t.segments) == expected
    uids = [g.prompt.uid for g in trained]
    assert len(set(uids)) == len(uids) == spec.steps * spec.schedule.batch_groups
    sched = run.scheduler
    # Each step's counters since the previous batch, and those since the last one (its publication's expiries).
    totals = {k: sum(s.stats.get(k, 0) for s in result.steps) + sched.stats.get(k, 0) for k in
              (*ABORTS, "rollout/groups_requeued", "rollout/samples_continued", "rollout/samples_requeued",
               "staleness/violations")}
    # Every group admitted trained, is still held, or ended another way; an expired group's prompt is
    # admitted again (or still waits to be): it is not one more prompt drawn.
    admitted = len(uids) + len(sched.flights) + len(sched.buffer) + sum(totals[k] for k in ABORTS)
    assert run.drawn == admitted - totals["rollout/groups_requeued"] + len(sched.requeued)
    assert totals["staleness/violations"] == 0
    assert run.elastic.leaves > 0
    totals["continued_trained"] = sum((g.group_id, t.sample_index) in continued
                                      for g in trained for t in g.trajectories)
    totals["multi_version"] = sum(len({s.weight_version for s in t.segments}) > 1
                                  for g in trained for t in g.trajectories)
    return totals


@pytest.mark.parametrize("warning_s", [None, 0.0, 1.5])
def test_no_sample_is_lost_or_duplicated_when_engines_leave(warning_s):
    rng = random.Random(14)
    seen = {"continued": 0, "requeued": 0, "continued_trained": 0, "multi_version": 0}
    for seed in range(4):
        alpha, replicate, partial = rng.choice([0.0, 1.0, 2.0]), rng.random() < 0.5, rng.random() < 0.7
        totals = _check_run(_spec(seed, warning_s, alpha, replicate, partial, colocated=alpha == 0 and seed % 2))
        seen["continued"] += totals["rollout/samples_continued"]
        seen["requeued"] += totals["rollout/samples_requeued"]
        seen["continued_trained"] += totals["continued_trained"]
        seen["multi_version"] += totals["multi_version"]
    if warning_s is None:  # nothing is handed back: every sample a leaving engine held starts again
        assert seen["continued"] == 0 and seen["requeued"] > 0
    else:
        assert seen["continued"] > 0 and seen["continued_trained"] > 0
    assert seen["multi_version"] > 0


def test_rollout_busy_is_a_share_of_the_engine_seconds_the_pool_had_during_the_step():
    run = SimRun(_spec(3, 0.0, 1.0, True, True))
    busy, records = [], []
    for n in range(1, 6):
        before = run.elastic.busy_s
        records.append(run.step(n))
        busy.append(run.elastic.busy_s - before)
    pool = run.elastic
    for r, b in zip(records, busy, strict=True):
        engine_s = sum(live * (min(t1, r.end) - max(t0, r.start))
                       for (t0, live), (t1, _) in zip(pool.timeline, [*pool.timeline[1:], (float("inf"), 0)],
                                                      strict=True) if min(t1, r.end) > max(t0, r.start))
        assert r.rollout_busy == pytest.approx(b / engine_s)
    # the pool changed size within some step: the engines at its end would have been the wrong count
    assert any(r.rollout_busy != pytest.approx(b / (r.engines * r.step_s)) for r, b in zip(records, busy, strict=True))
