"""The reward pool on real Ray actors: per-domain routing, a dying worker retried, failures isolated."""

from pathlib import Path

from gyre.cluster.group import RoleGroup
from gyre.cluster.reward_pool import DomainScorer, RewardPool
from gyre.cluster.workers import RewardWorker
from gyre.types import GenerationResult, PromptRecord, Sample

FNS = Path(__file__).with_name("pool_rewards.py")


def samples(domain, n):
    prompt = PromptRecord("p", "q", [1], "1", domain, domain)
    return [Sample(prompt, GenerationResult("r", i, [1], [2], "x" * (i + 1), [0.0], "eos", 0), None)
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


def test_a_dying_worker_is_retried_then_reported(ray_local, tmp_path):
    scorer = DomainScorer("k", group(ray_local, "k", "kill_worker_once", {"marker": str(tmp_path / "m")}), retries=1)
    pool = RewardPool({"k": scorer})
    batch = samples("k", 4)
    pool.score(batch)
    assert all(s.reward.status == "ok" and s.reward.score == 1.0 for s in batch)  # retried after the crash
    (tmp_path / "m2").unlink(missing_ok=True)
    no_retry = RewardPool({"k": DomainScorer("k", group(ray_local, "k2", "kill_worker_once",
                                                        {"marker": str(tmp_path / "m2")}, workers=1), retries=0)})
    batch = samples("k", 2)
    no_retry.score(batch)
    assert all(s.reward.status == "error" and "reward worker of domain 'k' failed" in s.reward.error for s in batch)


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
        sample.result.response_text = response
    pool.score(batch)
    assert batch[0].reward.correct and batch[-1].reward.correct
    assert all(s.reward.score == 0.0 and not s.reward.correct for s in batch[1:-1])
    assert not os.path.exists("/tmp/gyre_escape_test")
    again = samples("code", 1)  # the workers are still healthy
    again[0].prompt.ground_truth, again[0].result.response_text = tests, good
    pool.score(again)
    assert again[0].reward.correct
