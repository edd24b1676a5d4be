"""The rollout IO loop over real workers (tiny-model engines, a reward function in worker processes):
in-process role groups for speed, and once over Ray actors."""

from pathlib import Path

import pytest

from gyre.cluster.group import RoleGroup
from gyre.cluster.reward_pool import DomainScorer, RewardPool
from gyre.cluster.workers import RewardWorker, RolloutWorker
from gyre.rollout.driver import RolloutDriver
from gyre.rollout.scheduler import RolloutScheduler, ScheduleSpec
from gyre.types import PromptRecord, SamplingParams

FNS = Path(__file__).parents[1] / "cluster" / "pool_rewards.py"
PARAMS = SamplingParams(temperature=1.0, max_new_tokens=12, stop=tuple("aeiou0123"))


class CountingPool(RewardPool):
    """The real pool, recording the size of each part it is handed."""

    def __init__(self, scorers):
        super().__init__(scorers)
        self.parts: list[int] = []

    def submit(self, samples):
        self.parts.append(len(samples))
        super().submit(samples)


def engine_args(model_dir, rank):
    return (rank, str(model_dir), str(model_dir), "float32", False, "cpu", 1, None)


def run_batch(engines, rewards, replicate=False):
    pool = CountingPool({"default": DomainScorer("default", rewards)})
    scheduler = RolloutScheduler(ScheduleSpec(6, 4, PARAMS, run_seed=3, replicate=replicate), engines=len(engines))
    source = iter([PromptRecord(f"p{i}", "q", [3 + i, 7], "0") for i in range(4)])
    scheduler.admit(1, lambda k: [next(source) for _ in range(k)])
    driver = RolloutDriver(engines, pool, emit_every=4)
    times = driver.run(scheduler, lambda: scheduler.ready(1))
    groups = scheduler.take(1)
    driver.close()
    return pool, groups, times


@pytest.mark.parametrize("replicate", [False, True])
def test_engines_serve_samples_that_are_scored_as_they_arrive(tiny_model_dir, replicate):
    engines = RoleGroup.local("rollout", RolloutWorker, [engine_args(tiny_model_dir, r) for r in range(2)])
    rewards = RoleGroup.local_unplaced("reward", RewardWorker, 1, (f"{FNS}:length_reward", {}, 10.0, 1))
    pool, groups, times = run_batch(engines, rewards, replicate)
    assert len(pool.parts) > 1 and sum(pool.parts) == 24  # several parts, every sample once
    assert [g.group_id for g in groups] == [f"train-1-{i}" for i in range(4)]
    for g in groups:
        assert [t.sample_index for t in g.trajectories] == list(range(6))
        assert all(t.reward.score == len(t.response_text) for t in g.trajectories)
    assert times.generate > 0 and times.reward >= 0
    for group in (engines, rewards):
        group.kill()


def test_samples_do_not_depend_on_replication_or_transport(ray_local, tiny_model_dir):
    """The same seeds give the same samples whether a prompt's samples share a request or not, and
    whether the engines are in-process or Ray actors."""
    local = RoleGroup.local("rollout", RolloutWorker, [engine_args(tiny_model_dir, r) for r in range(2)])
    rewards = RoleGroup.local_unplaced("reward", RewardWorker, 1, (f"{FNS}:length_reward", {}, 10.0, 1))
    _, whole, _ = run_batch(local, rewards, replicate=False)
    _, spread, _ = run_batch(local, rewards, replicate=True)
    cls = ray_local.remote(concurrency_groups={"probe": 1, "serve": 1})(RolloutWorker).options(num_cpus=0.5)
    actors = [cls.remote(*engine_args(tiny_model_dir, r)) for r in range(2)]
    _, on_ray, _ = run_batch(RoleGroup("rollout", actors, (0, 1)), rewards)
    ids = [[t.response_ids for t in g.trajectories] for g in whole]
    assert ids == [[t.response_ids for t in g.trajectories] for g in spread]
    assert ids == [[t.response_ids for t in g.trajectories] for g in on_ray]
    for actor in actors:
        ray_local.kill(actor)
    local.kill()
    rewards.kill()


def ray_engines(ray_local, model_dir):
    cls = ray_local.remote(concurrency_groups={"probe": 1, "serve": 1})(RolloutWorker).options(num_cpus=0.5)
    return RoleGroup("rollout", [cls.remote(*engine_args(model_dir, r)) for r in range(2)], (0, 1),
                     spawn=lambda rank: cls.remote(*engine_args(model_dir, rank)), worker_cls=RolloutWorker)


def batch_with_a_fault(engines, rewards, fault):
    """``run_batch`` (replicated) on replaceable engines, calling ``fault()`` when the first samples are scored."""
    class FaultingPool(CountingPool):
        def submit(self, samples):
            if not self.parts:
                fault()
            super().submit(samples)

    scheduler = RolloutScheduler(ScheduleSpec(6, 4, PARAMS, run_seed=3, replicate=True), engines=2)
    source = iter([PromptRecord(f"p{i}", "q", [3 + i, 7], "0") for i in range(4)])
    scheduler.admit(1, lambda k: [next(source) for _ in range(k)])
    driver = RolloutDriver(engines, FaultingPool({"default": DomainScorer("default", rewards)}), emit_every=4,
                           replaceable=True)
    driver.run(scheduler, lambda: scheduler.ready(1))
    return driver, scheduler


@pytest.mark.slow  # make test-all (CI time): the publication-death test below keeps engine replacement
def test_a_dead_engine_is_replaced_and_its_samples_asked_of_the_others(ray_local, tiny_model_dir):
    """Engine 0 is killed once the first samples are scored; the batch still completes with the samples a
    run without the fault gives (regenerated from their seeds under the same weights)."""
    engines = ray_engines(ray_local, tiny_model_dir)
    rewards = RoleGroup.local_unplaced("reward", RewardWorker, 1, (f"{FNS}:length_reward", {}, 10.0, 1))
    _, straight, _ = run_batch(engines, rewards, replicate=True)
    driver, scheduler = batch_with_a_fault(engines, rewards, lambda: ray_local.kill(engines.actors[0]))
    groups = scheduler.take(1)
    assert driver.engine_deaths == 1 and scheduler.take_stats()["rollout/samples_requeued"] > 0
    assert [[t.response_ids for t in g.trajectories] for g in groups] == \
        [[t.response_ids for t in g.trajectories] for g in straight]
    driver.close()
    engines.kill()
    rewards.kill()


@pytest.mark.slow  # the default suite's fault drill stops a rollout engine too
def test_a_frozen_engine_is_replaced_once_it_has_been_silent_past_its_deadline(ray_local, tiny_model_dir):
    """Engine 0 is stopped (SIGSTOP: alive, silent) once the first samples are scored; after the deadline
    it is replaced in place and the batch completes with the samples a run without the fault gives."""
    import contextlib
    import os
    import signal

    from gyre.cluster.faults import Watchdog

    engines = ray_engines(ray_local, tiny_model_dir)
    rewards = RoleGroup.local_unplaced("reward", RewardWorker, 1, (f"{FNS}:length_reward", {}, 10.0, 1))
    _, straight, _ = run_batch(engines, rewards, replicate=True)
    # The generation wait is warm (three usual durations of 1 s), so its deadline is the 4 s stall floor;
    # the replacement engine's cold first calls (its model loads) get the 60 s ceiling, as in a run.
    engines.watchdog = Watchdog(call_timeout_s=60.0, stall_factor=1.0, stall_min_s=4.0)
    for _ in range(3):
        engines.watchdog.observe("rollout.generate(train)", 1.0)
    pid = ray_local.get(engines.actors[0].__ray_call__.remote(lambda self: os.getpid()))
    try:
        driver, scheduler = batch_with_a_fault(engines, rewards, lambda: os.kill(pid, signal.SIGSTOP))
    finally:
        with contextlib.suppress(ProcessLookupError):  # the replacement killed it, as it should have
            os.kill(pid, signal.SIGCONT)
    groups = scheduler.take(1)
    assert driver.engine_hangs == 1 and driver.engine_deaths == 0
    assert [[t.response_ids for t in g.trajectories] for g in groups] == \
        [[t.response_ids for t in g.trajectories] for g in straight]
    engines.watchdog = None
    driver.close()
    engines.kill()
    rewards.kill()


def test_an_engine_dead_at_a_weight_publication_is_replaced_holding_the_new_weights(ray_local, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from gyre.cluster.weights import pack_weights
    from gyre.rollout.machine import RolloutMachine

    engines = ray_engines(ray_local, tiny_model_dir)
    rewards = RoleGroup.local_unplaced("reward", RewardWorker, 1, (f"{FNS}:length_reward", {}, 10.0, 1))
    pool = RewardPool({"default": DomainScorer("default", rewards)})
    source = iter([PromptRecord(f"p{i}", "q", [3 + i, 7], "0") for i in range(100)])
    machine = RolloutMachine(RolloutDriver(engines, pool, replaceable=True), ScheduleSpec(2, 2, PARAMS, run_seed=3),
                             lambda k: [next(source) for _ in range(k)])
    state = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    machine.publish(0, [ray_local.put(pack_weights(state, 0))])
    ray_local.kill(engines.actors[1])
    machine.publish(1, [ray_local.put(pack_weights(state, 1))])
    assert machine.driver.engine_deaths == 1 and machine.version == 1
    assert engines.call(RolloutWorker.weight_version) == [1, 1]
    assert len(machine.next_batch(2).groups) == 2  # the fresh engine serves
    machine.close()
    engines.kill()
    rewards.kill()
