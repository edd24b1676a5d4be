"""The reward pool on real Ray actors: per-domain routing, failures isolated, and infrastructure faults
(worker actors killed or stopped mid-batch) survived without changing any result."""

import os
import signal
import time
from pathlib import Path

import pytest

from gyre.cluster.faults import PROBE
from gyre.cluster.group import RoleGroup
from gyre.cluster.reward_pool import DomainScorer, PoolLimits, RewardPool, RewardWorkerError, call_budget
from gyre.cluster.workers import RewardWorker
from gyre.types import PromptRecord, Segment, Trajectory
from tests.cluster.faults import SignalOnStart, gone, wait_until

FNS = Path(__file__).with_name("pool_rewards.py")
# Tight enough that a stopped worker is found in seconds, loose enough for a loaded 2-core machine.
LIMITS = PoolLimits(start_s=60.0, ping_s=2.5, probe_every_s=0.2)
# The faults hit the worker scoring "a" or "dddd", which open its children's chunks: a signal that
# arrives late still finds the worker busy.
RESPONSES = ["a", "bb", "boom", "dddd", "eeeee", "ffffff"]


def samples(domain, n):
    prompt = PromptRecord("p", "q", [1], "1", domain, domain)
    return [Trajectory(prompt, i, [Segment([2], [0.0], 0)], "x" * (i + 1), "eos")
            for i in range(n)]


def group(ray_local, name, fn, kwargs=None, workers=2):
    return RoleGroup.create_unplaced(name, RewardWorker, workers, 0.5, (f"{FNS}:{fn}", kwargs or {}, 10.0, 1),
                                     max_restarts=2)


def test_samples_are_routed_to_their_domain(ray_local):
    pool = RewardPool({"a": DomainScorer("a", group(ray_local, "a", "length_reward")),
                       "b": DomainScorer("b", group(ray_local, "b", "raises", workers=1))})
    a, b = samples("a", 9), samples("b", 3)
    pool.submit(a[:4])
    pool.submit(b + a[4:])  # parts arrive as the rollout streams them
    pool.wait()
    assert [s.reward.score for s in a] == [float(i + 1) for i in range(9)]
    assert all(s.reward.latency_s >= 0 for s in a)
    # A reward that raises fails its own samples only, counted as errors; the other domain is untouched.
    assert all(s.reward.status == "error" and "bad reward" in s.reward.error for s in b)


def test_the_prompt_row_s_columns_reach_the_reward_function():
    workers = RoleGroup.local_unplaced("c", RewardWorker, 1, (f"{FNS}:by_columns", {}, 10.0, 1))
    pool = RewardPool({"c": DomainScorer("c", workers)})
    batch = samples("c", 2)
    batch[0].prompt.columns = {"difficulty": 3, "weights": [0.5, 2.0], "unused": "x"}  # the prompt both share
    pool.score(batch)
    assert [s.reward.score for s in batch] == [1.5, 6.0]
    workers.kill()


@pytest.mark.slow  # about 12 s (CI time); the default suite keeps the stopped and killed worker cases
def test_a_dying_worker_is_retried_then_reported(ray_local, tmp_path):
    scorer = DomainScorer("k", group(ray_local, "k", "kill_worker_once", {"marker": str(tmp_path / "m")}), retries=1)
    pool = RewardPool({"k": scorer})
    batch = samples("k", 4)
    pool.score(batch)
    assert all(s.reward.status == "ok" and s.reward.score == 1.0 for s in batch)  # retried after the crash
    no_retry = RewardPool({"k": DomainScorer("k", group(ray_local, "k2", "kill_worker_once",
                                                        {"marker": str(tmp_path / "m2")}, workers=1), retries=0)})
    # Retries exhausted: a clear error naming the domain, the worker and the cause, never silent zeros.
    with pytest.raises(RewardWorkerError, match=r"reward domain 'k': worker 0 died \(.*retries=0.*raise retries"):
        no_retry.score(samples("k", 2))
    assert no_retry.metrics()["fault/reward_worker_deaths"] == 1
    for p in (pool, no_retry):
        p.scorers["k"].group.kill()


def texts(domain, responses):
    prompt = PromptRecord("p", "q", [1], "", domain, domain)
    return [Trajectory(prompt, i, [Segment([2], [0.0], 0)], text, "eos")
            for i, text in enumerate(responses)]


def slow_pool(name, workers, marks, max_restarts=2):
    """A domain scored by ``slow_score`` (pool_rewards.py), whose starts leave marks in ``marks``."""
    group = RoleGroup.create_unplaced(name, RewardWorker, workers, 0.5,
                                      (f"{FNS}:slow_score", {"delay": 0.3, "marks": str(marks)}, 5.0, 2),
                                      max_restarts=max_restarts)
    return RewardPool({name: DomainScorer(name, group, retries=2)}, LIMITS)


def scored(pool):
    """Score RESPONSES; what the scoring decided (everything but timings)."""
    (name,) = pool.scorers
    batch = texts(name, RESPONSES)
    pool.score(batch)
    return [(s.reward.score, s.reward.correct, s.reward.status, s.reward.error, s.reward.info) for s in batch]


def pids(pool):
    """(worker pid, its reward children's pids) per worker, once every worker answers (one killed by an
    earlier test may still be restarting)."""
    import ray

    def ask(actor, method):
        deadline = time.monotonic() + 60
        while True:
            try:
                return ray.get(getattr(actor, method).options(concurrency_group=PROBE).remote(), timeout=60)
            except ray.exceptions.ActorUnavailableError:
                assert time.monotonic() < deadline, "a reward worker did not come back"
                time.sleep(0.2)

    (scorer,) = pool.scorers.values()
    return [(ask(a, "ping"), ask(a, "child_pids")) for a in scorer.group.actors]


@pytest.fixture(scope="module")
def duo(ray_local, tmp_path_factory):
    """A domain with two workers, and an uninterrupted scoring of RESPONSES by it."""
    marks = tmp_path_factory.mktemp("marks")
    pool = slow_pool("duo", 2, marks)
    expected = scored(pool)
    assert expected[2] == (0.0, False, "error", "ValueError: bad response", {})
    assert expected[3] == (0.4, True, "ok", None, {"length": 4})
    assert set(pool.metrics().values()) == {0}
    yield pool, marks, expected
    pool.scorers["duo"].group.kill()


@pytest.mark.slow  # about 12 s; the default suite keeps the stopped and killed worker cases
def test_the_only_worker_killed_mid_batch_is_waited_for_then_replaced_when_ray_gives_up(duo, tmp_path):
    expected = duo[2]
    pool = slow_pool("solo", 1, tmp_path, max_restarts=1)
    for round_, what in enumerate(["Ray restarts it", "Ray gave up: a fresh actor replaces it"], start=1):
        (worker, children), = pids(pool)
        with SignalOnStart(tmp_path, "dddd", signal.SIGKILL, parent=True) as fault:
            got = scored(pool)
        assert fault.pid == worker
        assert got == expected, what
        faults = pool.metrics()
        assert faults["fault/reward_worker_deaths"] == round_
        assert faults["fault/reward_worker_replacements"] == round_ - 1
        assert faults["fault/reward_retried_samples"] == len(RESPONSES) * round_
        assert faults["fault/reward_child_deaths"] == 0  # the children died with their worker, never alone
        wait_until(lambda c=children: all(gone(p) for p in c), what="the killed worker's children to exit")
    assert scored(pool) == expected
    pool.scorers["solo"].group.kill()


def test_a_killed_worker_s_samples_go_to_the_healthy_one(duo):
    pool, marks, expected = duo
    before = pool.metrics()
    workers = [w for w, _ in pids(pool)]
    with SignalOnStart(marks, "a", signal.SIGKILL, parent=True) as fault:
        got = scored(pool)
    assert got == expected
    assert pool.metrics()["fault/reward_worker_deaths"] == before["fault/reward_worker_deaths"] + 1
    healthy = next(w for w in workers if w != fault.pid)
    starts = [m.name.split(".") for m in marks.iterdir() if m.name.startswith("a.") and m.name not in fault.seen]
    assert [int(ppid) for _, _, ppid, _ in sorted(starts, key=lambda m: int(m[3]))] == [fault.pid, healthy]
    assert scored(pool) == expected


def test_a_worker_killed_while_idle_is_counted_though_ray_restarted_it_unseen(ray_local, tmp_path):
    """No call was in flight, so none failed; Ray restarts the worker before any call could see it. The
    pool pings idle workers too: the death is found by the new process answering, and counted once."""
    pool = slow_pool("idle", 1, tmp_path)
    expected = scored(pool)
    assert pool.metrics()["fault/reward_worker_deaths"] == 0
    (victim, _), = pids(pool)
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: pids(pool)[0][0] != victim, what="Ray to restart the killed worker")

    def counted():
        pool.poll(0)  # what a run's driver does between events: the pool pings its workers, idle ones too
        return pool.metrics()["fault/reward_worker_deaths"] > 0

    wait_until(counted, what="the pool to count the death")
    assert scored(pool) == expected
    assert pool.metrics()["fault/reward_worker_deaths"] == 1
    pool.scorers["idle"].group.kill()


def test_a_stopped_worker_is_found_killed_and_replaced(duo):
    pool, marks, expected = duo
    before, children = pool.metrics(), dict(pids(pool))
    with SignalOnStart(marks, "a", signal.SIGSTOP, parent=True) as fault:
        got = scored(pool)
    assert got == expected  # its calls were re-sent to the other worker
    after = pool.metrics()
    assert after["fault/reward_worker_hangs"] == before["fault/reward_worker_hangs"] + 1
    assert after["fault/reward_worker_replacements"] == before["fault/reward_worker_replacements"] + 1
    assert scored(pool) == expected
    # Ray kills the stopped process within seconds, and its reward children die with it.
    wait_until(lambda: all(gone(p) for p in [fault.pid, *children[fault.pid]]), what="the stopped worker to exit")


def test_call_budget():
    # Two samples with deadlines 10 s and 20 s on 2 processes: each run may need a fresh child (60 s
    # start-up) -> runs of 70 s and 80 s; (150 / 2 + 80) = 155 s per round, 3 rounds (2 re-runs).
    assert call_budget([10.0, 20.0], 2) == pytest.approx(465.0)


def test_a_reward_model_role_scores_through_the_pool(ray_local, tiny_model_dir):
    from gyre.cluster.workers import ModelRewardWorker
    from gyre.config.reward_schema import RewardModelConfig

    rm = ray_local.remote(ModelRewardWorker).options(num_cpus=0.5).remote(
        "reward_model", RewardModelConfig(path=str(tiny_model_dir)), "cpu", 1)
    pool = RewardPool({"rm": DomainScorer("rm", RoleGroup("rm", [rm], ()))})
    batch = samples("rm", 5)
    pool.score(batch)
    assert all(s.reward.status == "ok" and isinstance(s.reward.score, float) for s in batch)
    assert len({round(s.reward.score, 6) for s in batch}) > 1  # responses of different lengths score differently
    ray_local.kill(rm)


HOSTILE = {
    "loop": "while True:\n    pass",
    "fork_bomb": "import os\nwhile True:\n    os.fork()",
    "allocation": "x = bytearray(10**10)",
    "socket": "import socket\nsocket.create_connection(('127.0.0.1', 22))",
    "host_file": "print(open('/etc/hostname').read())",
    "escape_dir": "open('/tmp/gyre_escape_test', 'w').write('x')",
}


def test_hostile_programs_are_contained_and_scoring_goes_on(ray_local):
    """Code responses that attack the sandbox fail alone; correct programs in the same batch still pass."""
    import json
    import os

    tests = json.dumps({"inputs": ["2 3\n"], "outputs": ["5"]})
    worker = RoleGroup.create_unplaced("code", RewardWorker, 2, 0.5,
                                       ("gyre.rewards.code:code_reward", {"timeout_s": 1.0}, 20.0, 1))
    pool = RewardPool({"code": DomainScorer("code", worker)})
    good = "a, b = map(int, input().split())\nprint(a + b)"
    responses = [good, *HOSTILE.values(), f"```python\n{good}\n```"]
    batch = samples("code", len(responses))
    for sample, response in zip(batch, responses):
        sample.prompt.ground_truth = tests
        sample.response_text = response
    pool.score(batch)
    assert batch[0].reward.correct and batch[-1].reward.correct
    assert all(s.reward.score == 0.0 and not s.reward.correct for s in batch[1:-1])
    assert not os.path.exists("/tmp/gyre_escape_test")
    again = samples("code", 1)  # the workers are still healthy
    again[0].prompt.ground_truth, again[0].response_text = tests, good
    pool.score(again)
    assert again[0].reward.correct
