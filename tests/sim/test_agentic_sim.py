"""The simulator's multi-turn path: the real EpisodeRunner on simulated environments (SimEnvs, WordTokenizer)."""

import pytest

from gyre.config.catalog import MODELS, device_class
from gyre.envs.calls import EnvCall
from gyre.envs.episode import EpisodeLimits
from gyre.rollout.scheduler import ScheduleSpec
from gyre.sim.cost import CostModel
from gyre.sim.run import Agentic, Layout, SimRun, SimSpec
from gyre.sim.services import SimEnvs
from gyre.sim.workload import Workload, WorkloadSpec
from gyre.types import SamplingParams

LIMITS = EpisodeLimits(max_turns=6, turn_tokens=128, context_tokens=8192, observation_tokens=256)


def agentic_run(alpha: float = 0.0, turn_sync: bool = False, cv: float = 1.0, steps: int = 4,
                **faults) -> tuple[SimRun, list]:
    """A small agentic simulation; returns it and the groups every step trained (in order). ``faults``:
    env_failure_rate / env_hang_rate of the workload."""
    sched = ScheduleSpec(4, 4, SamplingParams(1.0, 1.0, 0, LIMITS.turn_tokens, ()), 0, async_ratio=alpha,
                         replicate=True)
    layout = Layout(4, 4, 4, True) if alpha == 0 else Layout(4, 2, 2, False)
    workload = WorkloadSpec(turns=3.0, turns_cv=0.5, turn_tokens=64, observation_tokens=32, env_latency_s=5.0,
                            env_latency_cv=cv, max_tokens=LIMITS.turn_tokens, **faults)
    spec = SimSpec(sched, layout, CostModel(device_class("h100"), MODELS["0.5b"]), workload, steps=steps, warmup=1,
                   agentic=Agentic(LIMITS, slots=16, turn_sync=turn_sync, max_failures=50, step_timeout_s=40.0))
    run, trained = SimRun(spec), []
    take = run.scheduler.take

    def recording_take(step: int):
        groups = take(step)
        trained.append(groups)
        return groups

    run.scheduler.take = recording_take
    return run, trained


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_trained_episodes_have_their_turns_and_stay_in_the_window(alpha):
    run, trained = agentic_run(alpha)
    result = run.run()
    assert [len(groups) for groups in trained] == [4] * 4
    for groups in trained:
        for group in groups:
            index = int(group.prompt.columns["index"])
            turns = min(run.workload.turns(index), LIMITS.max_turns)  # every episode of a group plays its seed
            assert sorted(t.sample_index for t in group.trajectories) == [0, 1, 2, 3]
            for t in group.trajectories:
                assert len(t.turns) == turns
                # each turn wrote what the workload drew for (prompt, episode, turn), capped at the turn budget
                want = [min(run.workload.turn_tokens(index, t.sample_index, k), LIMITS.turn_tokens)
                        for k in range(turns)]
                assert [r.end - r.start for r in t.turns] == want
    assert all(s.stats["staleness/violations"] == 0 for s in result.steps)
    assert result.staleness_max <= alpha


def test_environment_level_async_beats_turn_synchronous_batching():
    """With env latency varying (cv 1), turn barriers wait for the slowest environment every turn."""
    fast = agentic_run(turn_sync=False)[0].run()
    synced = agentic_run(turn_sync=True)[0].run()
    assert synced.step_s > 1.2 * fast.step_s
    assert all(s.stats["staleness/violations"] == 0 for s in synced.steps)


def test_env_latency_is_keyed_by_the_call_not_its_arrival_order():
    """The same call (env seed, episode, call number) takes the same time whichever order calls arrive in, so
    schedules compared with each other see the same environments (paired comparisons)."""
    workload = Workload(WorkloadSpec(env_latency_s=5.0, env_latency_cv=1.0))
    calls = [EnvCall(0, "train-1-0/0@1", "reset", 7), EnvCall(1, "train-1-0/1@1", "reset", 7),
             EnvCall(2, "train-1-1/0@1", "reset", 9)]
    due = []
    for order in (calls, calls[::-1]):
        envs = SimEnvs(workload)
        for call in order:
            envs.submit(call, 0.0)
        due.append({r.call_id: t for t, _, r in envs._heap})
    assert due[0] == due[1]
    assert len(set(due[0].values())) == 3  # and different calls draw different latencies


def test_a_groups_episodes_succeed_or_fail_each_on_its_own():
    run, trained = agentic_run(0.0)
    run.run()
    groups = [g for gs in trained for g in gs]
    for g in groups:  # each episode's reward is its own draw, keyed by (environment seed, episode index)
        index = int(g.prompt.columns["index"])
        assert [t.reward.score for t in sorted(g.trajectories, key=lambda t: t.sample_index)] == \
            [float(run.workload.env_success(index, t)) for t in range(4)]
    # so groups have reward variance (all-equal groups would all be dropped by dynamic sampling)
    assert any(len({t.reward.score for t in g.trajectories}) > 1 for g in groups)


def test_failed_and_hung_environments_replace_their_episodes_and_cost_their_deadline():
    """A hung call holds its slot until env.step_timeout_s, then fails; a failed one fails after its latency;
    the runner replaces the episode (as in a real run) and every group still trains whole."""
    clean = agentic_run()[0].run()
    run, trained = agentic_run(env_failure_rate=0.05, env_hang_rate=0.05)
    faulty = run.run()
    envs = run.cluster.envs
    assert envs.failures > 0 and envs.hangs > 0
    stats = [s.stats for s in faulty.steps]
    assert sum(s.get("env/failures_error", 0) for s in stats) == envs.failures
    assert sum(s.get("env/failures_timeout", 0) for s in stats) == envs.hangs
    assert [len(groups) for groups in trained] == [4] * 4
    for group in [g for gs in trained for g in gs]:  # a replacement episode takes a new index in its group
        indices = [t.sample_index for t in group.trajectories]
        assert len(indices) == len(set(indices)) == 4
    assert faulty.step_s > clean.step_s  # the deadline (40 s) and the replayed episodes cost time


def test_fault_draws_follow_the_rates_and_the_calls_identity():
    w = Workload(WorkloadSpec(env_failure_rate=0.1, env_hang_rate=0.05), seed=3)
    faults = [w.env_fault((seed, episode, n)) for seed in range(50) for episode in range(4) for n in range(10)]
    assert abs(faults.count("hang") / len(faults) - 0.05) < 0.02
    assert abs(faults.count("error") / len(faults) - 0.1) < 0.03
    assert w.env_fault((7, 1, 2)) == Workload(WorkloadSpec(env_failure_rate=0.1, env_hang_rate=0.05), 3).env_fault(
        (7, 1, 2))
