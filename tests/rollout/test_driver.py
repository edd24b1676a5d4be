"""The rollout IO loop on real actors: two engines stream samples back, each part is scored as it arrives,
and the scheduler commits every group."""

from pathlib import Path

from gyre.cluster.group import RoleGroup
from gyre.cluster.reward_pool import DomainScorer, RewardPool
from gyre.cluster.workers import RewardWorker, RolloutWorker
from gyre.rollout.driver import RolloutDriver
from gyre.rollout.scheduler import RolloutScheduler, ScheduleSpec
from gyre.types import PromptRecord, SamplingParams

FNS = Path(__file__).parents[1] / "cluster" / "pool_rewards.py"


class CountingPool(RewardPool):
    """The real pool, recording the size of each part it is handed."""

    def __init__(self, scorers):
        super().__init__(scorers)
        self.parts: list[int] = []

    def submit(self, samples):
        self.parts.append(len(samples))
        super().submit(samples)


def test_engines_stream_parts_that_are_scored_as_they_arrive(ray_local, tiny_model_dir):
    cls = ray_local.remote(RolloutWorker).options(num_cpus=0.5)
    actors = [cls.remote(r, str(tiny_model_dir), str(tiny_model_dir), "float32", False, "cpu", 1, None)
              for r in range(2)]
    engines = RoleGroup("rollout", actors, (0, 1))
    rewards = RoleGroup.create_unplaced("reward", RewardWorker, 1, 0.5, (f"{FNS}:length_reward", {}, 10.0, 1))
    pool = CountingPool({"default": DomainScorer("default", rewards)})
    params = SamplingParams(temperature=1.0, max_new_tokens=12, stop=tuple("aeiou0123"))
    scheduler = RolloutScheduler(ScheduleSpec(6, 4, params, run_seed=3), engines=2)
    commands = scheduler.admit(1, [PromptRecord(f"p{i}", "q", [3 + i, 7], "0") for i in range(4)])
    times = RolloutDriver(engines, pool, stream_parts=4).run(scheduler, commands, lambda: scheduler.ready(1))
    assert len(pool.parts) > 2 and sum(pool.parts) == 24  # several parts per engine, every sample once
    groups = scheduler.take(1)
    assert [g.group_id for g in groups] == [f"train-1-{i}" for i in range(4)]
    for g in groups:
        assert [t.sample_index for t in g.trajectories] == list(range(6))
        assert all(t.reward.score == len(t.response_text) for t in g.trajectories)
    assert times.generate > 0 and times.reward >= 0
    for group in (engines, rewards):
        group.kill()
