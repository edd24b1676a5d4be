"""Elastic rollout capacity: the target rule (sans-IO) and lent engines joining and leaving a real driver's
pool (tiny-model engines as in-process actors) with every sample accounted for."""

import threading

import pytest

from gyre.cluster.group import RoleGroup
from gyre.cluster.local import LocalActor
from gyre.cluster.reward_pool import DomainScorer, RewardPool
from gyre.cluster.workers import RewardWorker, RolloutWorker
from gyre.rollout.capacity import Capacity, Resize
from gyre.rollout.driver import RolloutDriver
from gyre.rollout.elastic import LentEngines
from gyre.rollout.scheduler import RolloutScheduler, ScheduleSpec
from gyre.types import PromptRecord, SamplingParams
from tests.rollout.test_driver import FNS, engine_args

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=64)


# ---- the target rule ------------------------------------------------------------------------------
def test_lend_and_reclaim_move_the_target_within_the_pool_bounds():
    c = Capacity(base=2, most=5)
    assert c.target == 2
    assert c.lend(2) == 4 and c.lend(5) == 5  # clamped to max_engines
    assert c.reclaim(1) == 4 and c.reclaim(9) == 2  # never below the base pool


def test_resize_starts_the_missing_and_cancels_starting_before_reclaiming_running():
    c = Capacity(base=1, most=4, notice_s=7.0)
    c.lend(3)
    assert c.resize(running=1, starting=0) == Resize(start=3)
    assert c.resize(running=2, starting=2) == Resize()  # on its way
    assert not c.resize(running=4, starting=0)
    c.reclaim(2)
    # 4 running + 1 starting toward 2: give up the starting one, then take back two running ones
    assert c.resize(running=4, starting=1) == Resize(cancel=1, reclaim=2, notice_s=7.0)
    c.reclaim(1, notice_s=None)
    assert c.resize(running=2, starting=0) == Resize(reclaim=1, notice_s=None)


def test_the_schedule_applies_its_latest_entry_once():
    c = Capacity(base=1, most=3, schedule=[(2, 3), (5, 1)])
    c.at_step(1)
    assert c.target == 1
    c.at_step(2)
    assert c.target == 3
    c.reclaim(1)  # an operator's change holds until the next entry
    c.at_step(3)
    assert c.target == 2
    c.at_step(7)  # a resumed run lands on the size of its step
    assert c.target == 1


def test_lend_from_many_threads_is_counted_once_each():
    c = Capacity(base=1, most=100)
    threads = [threading.Thread(target=lambda: [c.lend(1) for _ in range(10)]) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c.target == 81


# ---- a real driver --------------------------------------------------------------------------------
def _prompts(n: int) -> list[PromptRecord]:
    return [PromptRecord(f"p{i}", "q", [3 + i, 7, 11], "0") for i in range(n)]


class Pool:
    """A base engine, lent engines started as in-process actors, a reward worker: the driver's real loop."""

    def __init__(self, model_dir, notice_s):
        self.engines = RoleGroup.local("rollout", RolloutWorker, [engine_args(model_dir, 0)])
        self.rewards = RoleGroup.local_unplaced("reward", RewardWorker, 1, (f"{FNS}:length_reward", {}, 10.0, 1))
        numbers = iter(range(1, 100))
        self.capacity = Capacity(base=1, most=3, notice_s=notice_s)
        self.elastic = LentEngines(self.capacity,
                                   lambda: LocalActor(RolloutWorker, *engine_args(model_dir, next(numbers))),
                                   join_timeout_s=120)
        pool = RewardPool({"default": DomainScorer("default", self.rewards)})
        self.driver = RolloutDriver(self.engines, pool, emit_every=2, replaceable=True, elastic=self.elastic)

    def batch(self, stream: str, prompts: list[PromptRecord], during=None):
        """``prompts``' groups of 4 samples by a scheduler made for the base pool (the driver tells it of
        the rest), run to completion; ``during()`` once samples came back and the last engine still owes some."""
        scheduler = RolloutScheduler(ScheduleSpec(4, len(prompts), PARAMS, run_seed=5, stream=stream,
                                                  replicate=True), engines=1)
        self.driver.enlist(scheduler)  # as a run's scheduler is, from its first batch on
        source = iter(prompts)
        scheduler.admit(1, lambda k: [next(source) for _ in range(k)])
        fired = []

        def done():
            if during is not None and not fired and scheduler.outstanding < 4 * len(prompts) - 2 \
                    and len(self.engines) - 1 in scheduler.busy_engines():
                fired.append(during())
            return scheduler.ready(1)

        self.driver.run(scheduler, done)
        self.driver.release(scheduler)
        return scheduler, scheduler.take(1)

    def settle(self):
        """Let engines still starting or leaving finish doing so (a run does this in its next batch)."""
        self.elastic.tick()
        while self.elastic.joining or self.elastic.leaving:
            self.driver._events(0.2, [])
            self.elastic.tick()

    def close(self):
        self.driver.close()
        self.engines.kill()
        self.rewards.kill()


def _check_complete(groups, prompts, size):
    assert sorted(g.prompt.uid for g in groups) == sorted(p.uid for p in prompts)
    for g in groups:
        assert sorted(t.sample_index for t in g.trajectories) == list(range(size))
        assert all(t.response_ids for t in g.trajectories)


@pytest.mark.parametrize("notice_s", [0.0, None])
def test_lent_engines_join_serve_and_leave_with_every_sample_accounted_for(tiny_model_dir, notice_s):
    pool = Pool(tiny_model_dir, notice_s)
    try:
        pool.capacity.lend(1)
        first = _prompts(6)
        scheduler, groups = pool.batch("a", first)
        _check_complete(groups, first, 4)
        assert pool.elastic.joins == 1 and pool.engines.live == [0, 1] and scheduler.engines == 2
        # The lent engine is taken back while it owes samples: they finish elsewhere.
        second = [PromptRecord(f"q{i}", "q", [5 + i, 2, 9, 4], "0") for i in range(8)]
        scheduler, groups = pool.batch("b", second, during=lambda: pool.capacity.reclaim(1))
        _check_complete(groups, second, 4)
        pool.settle()
        assert pool.elastic.leaves == 1 and pool.engines.live == [0] and len(pool.engines) == 2
        assert 1 in scheduler.requests.down
        stats = scheduler.take_stats()
        if notice_s is None:  # killed: what it owed is generated again from scratch
            assert pool.elastic.tokens_handed_back == 0 and pool.elastic.samples_orphaned > 0
            assert stats["rollout/samples_requeued"] >= pool.elastic.samples_orphaned
        else:  # stopped: the tokens it held came back and other engines continued them
            assert pool.elastic.tokens_handed_back > 0 and pool.elastic.samples_orphaned == 0
            assert stats["rollout/samples_continued"] > 0
        # A later engine joins as rank 2; the vacant rank 1 stays out of every call.
        pool.capacity.lend(1)
        third = _prompts(4)
        scheduler, groups = pool.batch("c", third)
        _check_complete(groups, third, 4)
        assert pool.engines.live == [0, 2] and scheduler.engines == 3 and 1 in scheduler.requests.down
        assert len(pool.driver.busy_seconds()) == 2
    finally:
        pool.close()


def test_the_controller_is_handed_the_runs_capacity():
    from pathlib import Path

    from gyre.rollout.elastic import start_controller

    capacity = Capacity(base=1, most=4)
    start_controller(f"{Path(__file__).parent / 'capacity_controllers.py'}:lend_two", capacity)
    assert capacity.target == 3
    with pytest.raises(ValueError, match="rollout.elastic.controller: .*no callable named 'nothing'"):
        start_controller(f"{Path(__file__).parent / 'capacity_controllers.py'}:nothing", capacity)


def test_the_schedules_answer_and_a_death_move_the_target_under_the_lock():
    c = Capacity(base=1, most=4, schedule=[(1, 3)])
    c.lend(3)  # an operator lent first: the schedule's 3 lowers the target, it does not raise it
    assert c.at_step(1) is False and c.target == 3
    assert c.lost(1) == 2  # a lent engine died: not replaced until asked again


def test_commands_for_an_engine_that_just_left_go_nowhere(tiny_model_dir):
    from gyre.rollout.requests import Abort, Generate
    from gyre.types import GenerationRequest

    pool = Pool(tiny_model_dir, 0.0)
    try:
        pool.engines.attach(LocalActor(RolloutWorker, *engine_args(tiny_model_dir, 7)))
        pool.engines.vacate(1)  # it left in the event round that queued these
        request = GenerationRequest("x-g/0", [3, 7, 11], PARAMS)
        pool.driver.send([Generate(1, (request,)), Abort({1: ("x-g/0",)})])  # no AttributeError on a vacant rank
    finally:
        pool.close()


def test_starts_that_keep_failing_back_off_and_await_joins_gives_up_at_its_deadline(tiny_model_dir):
    import time

    started = []

    def broken():
        started.append(1)
        return LocalActor(_BrokenRolloutWorker, *engine_args(tiny_model_dir, 9))

    pool = Pool(tiny_model_dir, 0.0)
    try:
        pool.elastic = pool.driver.elastic = LentEngines(pool.capacity, broken, join_timeout_s=30)
        pool.elastic.driver = pool.driver
        pool.capacity.lend(1)
        t0 = time.monotonic()
        pool.driver.await_joins()  # returns at the first failed start, not looping on restarts
        assert time.monotonic() - t0 < 20 and pool.elastic.join_failures == 1 and len(started) == 1
        pool.elastic.tick()  # backing off: no second start within the first second
        assert len(started) == 1 and not pool.elastic.joining
    finally:
        pool.close()


class _BrokenRolloutWorker(RolloutWorker):
    def weight_version(self) -> int:
        raise RuntimeError("this engine cannot report its weights")


def test_a_draining_engines_aborts_are_hand_backs_only_once_its_loop_was_stopped():
    """Before the stop, an aborted sample is one the scheduler or a weight update stopped (regenerated as on any
    engine, or waste); after it, the tokens its unfinished samples hold, to continue elsewhere."""
    from gyre.rollout.elastic import _Leaving
    from gyre.types import GenerationResult

    lent = LentEngines(Capacity(base=1, most=2), lambda: None, join_timeout_s=10)
    aborted = GenerationResult("a-g/0", 0, [1], [2, 3], "", [-0.1, -0.1], "abort", [0, 0])
    finished = GenerationResult("a-g/1", 1, [1], [4], "", [-0.1], "stop", [0])
    lent.leaving[1] = _Leaving(stop_at=1e12)
    assert lent.sort(1, [aborted, finished]) == [aborted, finished] and lent.leaving[1].handed_back == []
    lent.leaving[1].stopped_at = 0.0
    assert lent.sort(1, [aborted, finished]) == [finished] and lent.leaving[1].handed_back == [aborted]
