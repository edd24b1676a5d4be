"""Role groups of in-process actors (gyre.cluster.local): the Ray group's interface and fault categories,
with the real worker classes, without Ray."""

from __future__ import annotations

import re
import sys
import threading
import time
from typing import Protocol

import pytest

from gyre.cluster import transport
from gyre.cluster.faults import RoleFault, Watchdog
from gyre.cluster.group import RoleGroup
from gyre.cluster.reward_pool import DomainScorer, PoolLimits, RewardPool
from gyre.cluster.workers import RewardWorker, RolloutWorker
from gyre.types import GenerationRequest, SamplingParams
from tests.cluster.test_reward_pool import FNS, RESPONSES, texts

GATES: dict[str, threading.Event] = {}
"""Gates the test opens (by name: a worker's arguments are copies, so an Event cannot be passed)."""


class Gate:
    """A stand-in worker whose calls return, raise, or block until the test opens their gate."""

    def __init__(self, broken: bool = False):
        if broken:
            raise RuntimeError("cannot start")

    def echo(self, value):
        return value

    def append(self, items: list) -> list:
        items.append("worker")
        return items

    def fail(self) -> None:
        raise ValueError("the method's own error")

    def block(self, gate: str) -> str:
        GATES[gate].wait(30)
        return gate

    def parts(self, gate: str):
        yield "first"
        GATES[gate].wait(30)
        yield "second"


@pytest.fixture
def gates():
    yield lambda name: GATES.setdefault(name, threading.Event())
    for gate in GATES.values():  # no test leaves a thread blocked
        gate.set()
    GATES.clear()


def read_stream(stream, timeout_s: float = 30.0) -> list:
    parts = []
    while True:
        ready, _ = transport.wait([stream], 1, timeout_s)
        assert ready, "the stream sent nothing"
        part = transport.next_part(stream)
        if part is transport.STREAM_END:
            return parts
        parts.append(part)


def test_calls_by_method_reference_return_results_in_rank_order():
    group = RoleGroup.local("echo", Gate, [(), (), ()])
    assert group.call(Gate.echo, "x") == ["x", "x", "x"]
    assert group.call_each(Gate.echo, [(0,), (1,), (2,)]) == [0, 1, 2]
    with pytest.raises(TypeError, match="a remote method is a worker class's method"):
        group.call("echo", 5)  # a name is refused: a renamed method must fail where it is called
    with pytest.raises(TypeError, match="RewardWorker.score is not a method of its workers' class Gate"):
        group.call(RewardWorker.score, [])
    group.kill()


def test_a_vacated_rank_stays_out_of_calls_and_an_attached_actor_is_the_next_rank():
    """A lent engine taken back leaves its rank empty; one that joins later gets a new rank."""
    from gyre.cluster.local import LocalActor

    group = RoleGroup.local("g", Gate, [(), (), ()])
    group.vacate(1)
    assert group.live == [0, 2] and len(group) == 3
    assert group.call(Gate.echo, 5) == [5, 5]
    assert group.call_each(Gate.echo, [("a",), ("c",)]) == ["a", "c"]
    assert group.attach(LocalActor(Gate)) == 3
    assert group.live == [0, 2, 3] and group.call(Gate.echo, 1) == [1, 1, 1]
    with pytest.raises(RoleFault) as info:  # a fault names the actor's own rank, not its place among the live
        group.gather([group.submit_to(3, Gate.fail), group.submit_to(0, Gate.echo, 0)], Gate.fail, ranks=[3, 0])
    assert info.value.ranks == (3,)
    group.kill()


class Echoes(Protocol):
    def echo(self, value): ...


class Pings(Protocol):
    def ping(self): ...


def test_a_protocol_method_names_the_call_every_class_that_answers_it():
    group = RoleGroup.local("echo", Gate, [(), ()])
    assert group.call(Echoes.echo, 7) == [7, 7]
    with pytest.raises(TypeError, match="Pings.ping is not a method of its workers' class Gate"):
        group.call(Pings.ping)
    group.kill()


def test_calls_copy_their_arguments_and_refs_arrive_as_values():
    group = RoleGroup.local("copy", Gate, [(), ()])
    items = ["driver"]
    assert group.call(Gate.append, items) == [["driver", "worker"]] * 2
    assert items == ["driver"]  # the worker changed its copy, as over Ray
    first = group.submit_to(0, Gate.echo, 7)
    assert transport.get(group.submit_to(1, Gate.echo, first)) == 7  # a ref argument arrives as its value
    nested = transport.get(group.submit_to(1, Gate.echo, [first]))
    assert transport.get(nested[0]) == 7  # one inside a list stays a ref
    with pytest.raises(Exception, match="Can't pickle"):
        group.submit(Gate.echo, lambda: 1)  # what Ray could not send either fails at the call
    group.kill()


def test_a_raising_method_is_an_error_and_its_actor_lives():
    group = RoleGroup.local("critic", Gate, [(), ()])
    with pytest.raises(RoleFault) as info:
        group.call_each(Gate.echo, [(1,), ()])  # rank 1: a wrong number of arguments
    assert (info.value.kind, info.value.ranks, info.value.recoverable) == ("error", (1,), False)
    assert "TypeError: Gate.echo() missing 1 required positional argument" in info.value.cause
    with pytest.raises(RoleFault) as info:
        group.call(Gate.fail)
    assert info.value.kind == "error" and info.value.cause.endswith("ValueError: the method's own error")
    assert re.match(r"critic rank [01] failed during fail: ", str(info.value))  # whichever raised first
    assert group.call(Gate.echo, 3) == [3, 3]
    group.kill()


def test_a_killed_actor_is_a_death_and_a_crashed_one_restarts(gates):
    group = RoleGroup.local("policy", Gate, [(), ()])
    refs = group.submit(Gate.block, "never")
    gates("never")
    start = time.monotonic()
    transport.kill(group.actors[1])
    with pytest.raises(RoleFault) as info:
        group.gather(refs, Gate.block)
    assert (info.value.kind, info.value.ranks, info.value.recoverable) == ("died", (1,), True)
    assert "was killed" in info.value.cause and time.monotonic() - start < 1.0  # not after rank 0's call
    with pytest.raises(transport.ActorLost):  # dead for good: later calls fail at once
        transport.get(group.submit_to(1, Gate.echo, 1), timeout=1)
    crashing = RoleGroup.local_unplaced("reward.x", Gate, 1, (), max_restarts=1)
    transport.kill(crashing.actors[0], no_restart=False)  # a crash, with a restart left
    assert crashing.call(Gate.echo, "back") == ["back"]
    broken = RoleGroup.local("broken", Gate, [(True,)])
    with pytest.raises(RoleFault) as info:
        broken.call(Gate.echo, 1)
    assert info.value.kind == "died" and "error raised in its creation task" in info.value.cause
    for g in (group, crashing, broken):
        g.kill()


def test_a_hung_call_passes_its_deadline_and_the_probe_says_where(gates):
    gates("hang")
    group = RoleGroup.local("rollout", Gate, [(), ()], watchdog=Watchdog(call_timeout_s=0.3))
    start = time.monotonic()
    with pytest.raises(RoleFault) as info:
        group.call_each(Gate.block, [("hang",), ("hang",)])
    assert time.monotonic() - start < 3.0
    fault = info.value
    assert (fault.kind, fault.ranks, fault.recoverable) == ("hung", (0, 1), True)
    # The probe ran beside the stuck call and reports the actor's own thread, not the driver's.
    assert "rank 0: pid" in fault.cause and "busy in wait (threading.py" in fault.cause
    assert "block (test_local_group.py" in fault.cause and "gather" not in fault.cause
    group.kill()


def test_a_stream_is_read_part_by_part_while_its_method_runs(gates):
    group = RoleGroup.local("rollout", Gate, [()])
    gate = gates("stream")
    (stream,) = group.submit(Gate.parts, "stream")
    assert transport.wait([stream], 1, 5)[0] == [stream]
    assert transport.next_part(stream) == "first"
    assert transport.wait([stream], 1, 0.05) == ([], [stream])  # the method is still blocked
    gate.set()
    assert read_stream(stream) == ["second"]
    gates("killed")
    (stream,) = group.submit(Gate.parts, "killed")
    assert transport.next_part(stream) == "first"
    transport.kill(group.actors[0])
    with pytest.raises(transport.ActorLost):  # the part that will never come fails
        transport.next_part(stream)
    assert transport.next_part(stream) is transport.STREAM_END


def test_a_local_rollout_worker_streams_what_its_engine_generates(tiny_model_dir):
    import torch

    from gyre.cluster.workers import SERVE
    from gyre.engines.hf_rollout import HFRolloutEngine
    from gyre.models.loading import load_causal_lm, load_tokenizer

    path = str(tiny_model_dir)
    # This process's thread count, so the worker (which sets it) leaves the test session as it was.
    group = RoleGroup.local("rollout", RolloutWorker, [(0, path, path, "float32", False, "cpu",
                                                         torch.get_num_threads(), None)])
    params = SamplingParams(temperature=1.0, max_new_tokens=12, stop=tuple("aeiou0123"))
    requests = [GenerationRequest(f"r{i}", [3 + i, 7], params, n=6, seed=i) for i in range(4)]
    stream = group.actors[0].serve.options(concurrency_group=SERVE).remote(8, 0.05)
    group.call(RolloutWorker.add, requests)
    parts = []
    while sum(len(p) for p in parts) < 24:
        assert transport.wait([stream], 1, 30.0)[0], "the stream sent nothing"
        parts.append(transport.next_part(stream))
    group.call(RolloutWorker.stop_serving)
    assert read_stream(stream) == []  # stopping ends the stream
    assert len(parts) > 1  # finished samples came out before the rest were decoded
    engine = HFRolloutEngine(load_causal_lm(path), load_tokenizer(path), "cpu")
    streamed = sorted((r for p in parts for r in p), key=lambda r: (r.request_id, r.sample_index))
    assert [(r.request_id, r.sample_index, r.response_ids) for r in streamed] == \
        [(r.request_id, r.sample_index, r.response_ids) for r in engine.generate(requests)]
    assert group.call(RolloutWorker.weight_version) == [0]
    group.kill()


# ---- the reward pool over in-process reward workers -----------------------------------------------------

LIMITS = PoolLimits(start_s=30.0, ping_s=5.0, probe_every_s=0.05)


def local_pool(name: str, workers: int, max_restarts: int = 0) -> RewardPool:
    """A domain scored by ``slow_score`` (pool_rewards.py, 0.05 s a sample) on in-process RewardWorkers."""
    group = RoleGroup.local_unplaced(name, RewardWorker, workers, (f"{FNS}:slow_score", {"delay": 0.05}, 5.0, 1),
                                     max_restarts=max_restarts)
    return RewardPool({name: DomainScorer(name, group, retries=2)}, LIMITS)


def expected(text: str) -> tuple:
    """What slow_score decides for ``text``."""
    if text == "boom":
        return 0.0, False, "error"
    return len(text) / 10, len(text) % 2 == 0, "ok"


def test_poll_hands_back_each_scored_item_once_and_wait_the_rest():
    pool = local_pool("duo", 2)
    batch = texts("duo", RESPONSES)
    pool.submit(batch[:3])
    start = time.monotonic()
    assert pool.poll(0) == [] and time.monotonic() - start < 0.1  # nothing is scored this soon; no wait
    pool.submit(batch[3:])
    got = pool.poll(10.0)
    assert got and all(s.reward is not None for s in got)
    got += pool.wait()
    assert sorted(id(s) for s in got) == sorted(id(s) for s in batch)  # each item exactly once
    assert [(s.reward.score, s.reward.correct, s.reward.status) for s in batch] == [expected(t) for t in RESPONSES]
    assert pool.poll(0) == [] and pool.wait() == [] and not pool.busy
    pool.scorers["duo"].group.kill()


@pytest.mark.parametrize("restarts", [0, 1], ids=["replaced", "restarted"])
def test_a_worker_that_dies_mid_batch_is_replaced_or_restarted(restarts):
    pool = local_pool("solo", 1, max_restarts=restarts)
    group = pool.scorers["solo"].group
    first = group.actors[0]
    batch = texts("solo", RESPONSES)
    pool.submit(batch)
    transport.kill(first, no_restart=False)  # a crash: restarted only with a restart left
    assert len(pool.wait()) == len(batch)
    assert [(s.reward.score, s.reward.correct, s.reward.status) for s in batch] == [expected(t) for t in RESPONSES]
    faults = pool.metrics()
    assert faults["fault/reward_worker_deaths"] == 1
    assert faults["fault/reward_worker_replacements"] == 1 - restarts
    assert faults["fault/reward_retried_samples"] == len(batch)
    assert (group.actors[0] is first) == bool(restarts)  # a fresh actor only when none came back
    group.kill()


def test_local_groups_do_not_import_ray():
    import subprocess

    code = ("import sys, collections\n"
            "from gyre.cluster.group import RoleGroup\n"
            "g = RoleGroup.local('q', collections.Counter, [(), ()])\n"
            "assert g.call(collections.Counter.total) == [0, 0]\n"
            "g.kill()\n"
            "assert 'ray' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
