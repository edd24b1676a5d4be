"""Lockstep asynchrony (``LockstepPlan``, ``ScheduleSpec(lockstep=True)``): which version generates each
group is fixed in advance, so random event orders give the same batches, and a run saved at any step
and restored continues the same stream. The world holds a publication until the scheduler has settled,
as ``RolloutMachine`` does."""

import json
import random

import pytest

from gyre.rollout.buffer import LockstepPlan, staleness_limit
from gyre.rollout.policies import GroupFilter
from gyre.rollout.scheduler import RolloutScheduler, ScheduleSpec
from gyre.types import SamplingParams
from tests.rollout.harness import Source, World


def spec(alpha, groups=4, **kw):
    return ScheduleSpec(2, groups, SamplingParams(max_new_tokens=4), run_seed=7, async_ratio=alpha, replicate=True,
                        lockstep=True, **kw)


def test_the_plan_generates_each_batch_with_the_oldest_versions_the_window_allows():
    whole = LockstepPlan(1, 4)
    assert [whole.parts(n) for n in (1, 2, 3, 4)] == [[(0, 4)], [(0, 4)], [(1, 4)], [(2, 4)]]
    assert whole.due(0, 0) == [(1, 0, 4), (2, 0, 4)] and whole.due(1, 1) == [(2, 0, 4), (3, 0, 4)]
    half = LockstepPlan(0.5, 4)  # half of each batch one version older than the rest
    assert [half.parts(n) for n in (1, 2, 3)] == [[(0, 4)], [(0, 2), (1, 2)], [(1, 2), (2, 2)]]
    assert half.due(0, 0) == [(1, 0, 4), (2, 0, 2)]
    assert LockstepPlan(0.25, 2).parts(5) == [(4, 2)]  # a quota of 0 groups: on-policy
    assert LockstepPlan(2, 3).parts(6) == [(3, 3)]


class Machine:
    """What ``RolloutMachine`` does with a lockstep scheduler, on the scripted world."""

    def __init__(self, sched, rng, source, reward=None):
        self.world = World(sched, rng) if reward is None else World(sched, rng, reward)
        self.sched, self.source, self.pending = sched, source, None

    def publish(self, version):
        if self.pending is not None:  # the one held before loads first
            self.settle()
            self.advance()
        self.pending = version
        self.advance()

    def advance(self):
        self.sched.admit(0, self.source)
        if self.pending is not None and self.sched.settled:
            self.world.version, self.pending = self.pending, None
            self.sched.on_published(self.world.version)
            self.sched.admit(0, self.source)
        self.world.pump()

    def next_batch(self, step):
        self.advance()
        while not self.sched.ready(step):
            assert self.world.step(), f"the world went quiet before step {step}'s batch was ready"
            self.advance()
        return self.sched.take(step)

    def train(self, events):
        """Training runs while the rollout goes on (a random number of events)."""
        for _ in range(events):
            self.world.step()
            self.advance()

    def settle(self):
        while not self.sched.settled:
            assert self.world.step()
            self.sched.admit(0, self.source)
            self.world.pump()


def record(batch):
    return [(g.group_id, g.prompt.uid, g.admitted_version, [t.weight_version for t in g.trajectories],
             [t.reward.score for t in g.trajectories]) for g in batch]


def run(alpha, seed, steps=10, reward=None, group_filter=None, max_draws=None, save_at=None):
    """Batches of a run with events in a random order; with ``save_at``, the run is saved after that step
    and continued by a fresh scheduler from its state."""
    rng = random.Random(seed)
    machine = Machine(RolloutScheduler(spec(alpha, group_filter=group_filter, max_draws=max_draws), engines=2), rng,
                      Source(), reward)
    machine.pending = 0
    out = []
    for step in range(1, steps + 1):
        batch = machine.next_batch(step)
        limit = staleness_limit(alpha)
        assert all(step - 1 - g.admitted_version <= limit for g in batch)
        assert all(t.weight_version == g.admitted_version for g in batch for t in g.trajectories)
        out.append(record(batch))
        machine.train(rng.randrange(15))
        machine.publish(step)
        if step == save_at:
            machine.settle()
            state = json.loads(json.dumps(machine.sched.state_dict()))  # what driver.json keeps
            source = Source()
            source.drawn = list(machine.source.drawn)
            fresh = RolloutScheduler(spec(alpha, group_filter=group_filter, max_draws=max_draws), engines=2)
            fresh.load_state_dict(state, {p.uid: p for p in source.drawn}, step)
            assert fresh.requeued == []
            machine = Machine(fresh, random.Random(seed + 100), source, reward)
            machine.pending = step
    return out


@pytest.mark.parametrize("alpha", [1, 2, 0.5, 1.5])
def test_batches_do_not_depend_on_the_order_of_events(alpha):
    first = run(alpha, seed=0)
    for seed in (1, 2, 3):
        assert run(alpha, seed) == first
    plan = LockstepPlan(alpha, 4)
    for step, batch in enumerate(first, start=1):
        assert sorted(g[2] for g in batch) == sorted(v for v, count in plan.parts(step) for _ in range(count))


def test_dynamic_sampling_refills_the_same_way_whatever_finishes_first():
    def reward(prompt, sample):  # every third prompt is uniform, and filtered
        return 1.0 if int(prompt.uid[1:]) % 3 == 0 else float(sample % 2)

    first = run(1, seed=0, reward=reward, group_filter=GroupFilter(0.0), max_draws=8)
    assert all(int(g[1][1:]) % 3 for batch in first for g in batch)
    for seed in (1, 2):
        assert run(1, seed, reward=reward, group_filter=GroupFilter(0.0), max_draws=8) == first


@pytest.mark.parametrize("alpha,save_at", [(1, 1), (1, 4), (2, 3), (0.5, 5)])
def test_a_saved_and_restored_run_continues_the_same_stream(alpha, save_at):
    assert run(alpha, seed=5, save_at=save_at) == run(alpha, seed=6)


def test_lockstep_refuses_redundancy():
    with pytest.raises(ValueError, match="redundancy"):
        spec(1, redundancy=1)
