"""Multi-turn rollout over real workers: tiny-model engines in process, environment workers as Ray
actors hosting environments that hang or crash; the driver waits on engines and environments together."""

from pathlib import Path

import pytest

from gyre.cluster.env_pool import EnvPool
from gyre.cluster.group import RoleGroup
from gyre.cluster.reward_pool import RewardPool
from gyre.cluster.workers import EnvWorker, RolloutWorker
from gyre.envs.context import ContextBuilder
from gyre.envs.episode import EpisodeLimits
from gyre.envs.host import EnvSpec
from gyre.models.presets import build_char_tokenizer
from gyre.rollout.driver import RolloutDriver
from gyre.rollout.episodes import EpisodeRunner
from gyre.rollout.scheduler import RolloutScheduler, ScheduleSpec
from gyre.types import PromptRecord, SamplingParams

HOSTILE = Path(__file__).parents[1] / "envs" / "hostile_envs.py"


def engine_args(model_dir, rank):
    return (rank, str(model_dir), str(model_dir), "float32", False, "cpu", 1, None)


def rollout_episodes(model_dir, env: str, kwargs: dict, timeout_s: float, pool_cls=EnvPool, seed: int = 1):
    """One batch of 3 groups x 2 episodes (2 turns of 4-8 tokens at most) on in-process engines and 2
    environment workers of 2 slots each; returns the pieces to check and to stop."""
    engines = RoleGroup.local("rollout", RolloutWorker, [engine_args(model_dir, r) for r in range(2)])
    workers = RoleGroup.create_unplaced("env", EnvWorker, 2, 0.25, (EnvSpec(env, kwargs), 2, timeout_s, timeout_s))
    pool = pool_cls(workers, per_worker=2, deadline_s=timeout_s)
    sampling = SamplingParams(max_new_tokens=8)
    runner = EpisodeRunner(pool.slots, ContextBuilder(build_char_tokenizer(), use_template=False),
                           EpisodeLimits(max_turns=2, turn_tokens=8, context_tokens=200), sampling, max_failures=8)
    sched = RolloutScheduler(ScheduleSpec(2, 3, sampling, run_seed=seed, replicate=True), engines=2, source=runner)
    source = iter([PromptRecord(f"env{i}", "", [], "") for i in range(50)])
    sched.admit(1, lambda k: [next(source) for _ in range(k)])
    driver = RolloutDriver(engines, RewardPool({}), emit_every=1, envs=pool)
    driver.run(sched, lambda: sched.ready(1))
    batch, stats = sched.take(1), sched.take_stats()
    driver.close()
    pool.close()
    engines.kill()
    workers.kill()
    assert len(batch) == 3 and all(len(g.trajectories) == 2 for g in batch)
    return batch, stats, pool


def test_episodes_complete_while_environments_hang_and_crash(ray_local, tiny_model_dir):
    batch, stats, _ = rollout_episodes(tiny_model_dir, f"{HOSTILE}:Flaky", {}, 2.0)
    assert all(t.reward.score == 1.0 and len(t.turns) == 1 for g in batch for t in g.trajectories)
    assert stats.get("env/failures_timeout", 0) + stats.get("env/failures_crashed", 0) >= 1


@pytest.mark.slow  # about 40 s: a fresh worker starts its environments' processes again
def test_a_dead_environment_worker_is_replaced_and_its_episodes_rerun(ray_local, tiny_model_dir):
    killed = []

    class KillingPool(EnvPool):
        def poll(self, ready):
            if ready and not killed:
                killed.append(ray_local.kill(self.workers.actors[0]))
            return super().poll(ready)

    _, stats, pool = rollout_episodes(tiny_model_dir, f"{HOSTILE}:Counter", {"limit": 2}, 20.0, KillingPool, seed=2)
    assert killed and pool.worker_restarts == 1
    assert stats["env/failures_crashed"] >= 1
