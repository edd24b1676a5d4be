"""Deadlines and fault reports of role calls, with real Ray actors and real process faults."""

from __future__ import annotations

import os
import signal
import time

import pytest

from gyre.cluster.faults import PROBE, RoleFault, Watchdog, gather


class Sleeper:
    """A stand-in role worker: sleeps, raises, or joins a gloo all-reduce with its peers."""

    def pid(self) -> int:
        return os.getpid()

    def nap(self, seconds: float, value: int) -> int:
        time.sleep(seconds)
        return value

    def fail(self) -> None:
        raise ValueError("the method's own error")

    def lose_peer(self) -> None:
        raise RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:40000")

    def join(self, rank: int, world: int, port: int) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)

    def all_reduce(self, seconds: float) -> float:
        import torch
        import torch.distributed as dist

        time.sleep(seconds)
        t = torch.ones(1)
        dist.all_reduce(t)
        return float(t)


@pytest.fixture
def workers(ray_local):
    remote = ray_local.remote(concurrency_groups={PROBE: 1})(Sleeper).options(num_cpus=0)
    actors = [remote.remote() for _ in range(2)]
    pids = ray_local.get([a.pid.remote() for a in actors])
    yield actors, pids
    for actor, pid in zip(actors, pids):
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        ray_local.kill(actor)


def test_watchdog_deadline_follows_the_usual_duration():
    dog = Watchdog(call_timeout_s=100.0, stall_factor=10.0, stall_min_s=5.0)
    assert dog.deadline_s("policy.train") == 100.0  # no history: the ceiling
    for seconds in (0.2, 0.4, 0.3):
        dog.observe("policy.train", seconds)
    assert dog.usual("policy.train") == pytest.approx(0.3)
    assert dog.deadline_s("policy.train") == 5.0  # 10 x 0.3 = 3 s, but never below stall_min_s
    for seconds in (2.0, 2.0, 2.0, 2.0):
        dog.observe("policy.train", seconds)
    assert dog.deadline_s("policy.train") == pytest.approx(20.0)  # median 2.0 x 10
    for _ in range(20):
        dog.observe("policy.train", 50.0)
    assert dog.deadline_s("policy.train") == 100.0  # capped by the ceiling
    slow = []
    dog.on_slow = lambda key, elapsed, usual: slow.append((key, elapsed, usual))
    dog.tick("policy.train", 100.0)
    dog.tick("policy.train", 200.0)
    assert slow == [("policy.train", 200.0, 50.0)]  # 3 x usual passed only at 200 s
    dog.history["policy.train"].extend([2.0] * 20)
    dog.rebuilt()
    assert dog.deadline_s("policy.train") == 100.0  # new workers: the first call loads, so the ceiling again
    dog.observe("policy.train", 2.0)
    assert dog.deadline_s("policy.train") == pytest.approx(20.0)


def test_gather_returns_results_in_rank_order(workers):
    actors, _ = workers
    refs = [actors[0].nap.remote(0.3, 10), actors[1].nap.remote(0.0, 11)]
    assert gather(refs, "policy", "nap", actors, Watchdog(call_timeout_s=30)) == [10, 11]


def test_a_killed_worker_is_a_death_naming_its_rank(workers):
    actors, pids = workers
    refs = [actors[0].nap.remote(30, 0), actors[1].nap.remote(30, 1)]
    time.sleep(0.5)
    os.kill(pids[1], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(RoleFault) as info:
        gather(refs, "policy", "train", actors, Watchdog(call_timeout_s=60))
    fault = info.value
    assert (fault.role, fault.ranks, fault.kind, fault.recoverable) == ("policy", (1,), "died", True)
    assert time.monotonic() - start < 20  # not after rank 0's 30 s nap
    assert str(fault).startswith("policy rank 1 died during train:")


def test_a_stopped_worker_is_hung_and_probed(workers):
    actors, pids = workers
    refs = [actors[0].nap.remote(30, 0), actors[1].nap.remote(30, 1)]
    time.sleep(0.5)
    os.kill(pids[1], signal.SIGSTOP)
    with pytest.raises(RoleFault) as info:
        gather(refs, "rollout", "generate", actors, Watchdog(call_timeout_s=2.0))
    fault = info.value
    assert fault.kind == "hung" and fault.ranks == (0, 1)
    assert "rank 0: pid" in fault.cause and "nap (test_faults.py" in fault.cause  # where rank 0 is busy
    assert "rank 1: does not respond (stopped" in fault.cause


def test_a_raising_method_is_an_error_with_its_message(workers):
    actors, _ = workers
    with pytest.raises(RoleFault) as info:
        gather([actors[0].fail.remote(), actors[1].nap.remote(0, 1)], "critic", "train", actors, None)
    assert info.value.kind == "error" and not info.value.recoverable
    assert "ValueError: the method's own error" in info.value.cause


def test_a_rank_lost_inside_a_collective_is_reported_as_the_death(workers):
    actors, pids = workers
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gather([a.join.remote(r, 2, port) for r, a in enumerate(actors)], "policy", "setup", actors, None)
    refs = [actors[0].all_reduce.remote(0.0), actors[1].all_reduce.remote(2.0)]
    time.sleep(0.7)  # rank 0 waits in the all-reduce for rank 1, which is still asleep
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(RoleFault) as info:
        gather(refs, "policy", "train", actors, Watchdog(call_timeout_s=60))
    assert info.value.kind == "died" and info.value.ranks == (1,)


def test_a_survivor_that_reports_a_lost_peer_first_names_the_peer_that_died():
    """gloo's survivor may answer before the dead rank's loss is known: the report is still the death."""
    import threading

    from gyre.cluster import transport
    from gyre.cluster.local import LocalActor

    survivor, doomed = LocalActor(Sleeper), LocalActor(Sleeper)
    refs = [survivor.lose_peer.remote(), doomed.nap.remote(30, 1)]
    threading.Timer(0.3, transport.kill, args=(doomed,)).start()
    with pytest.raises(RoleFault) as info:
        gather(refs, "policy", "train", [survivor, doomed], Watchdog(call_timeout_s=60))
    assert (info.value.kind, info.value.ranks) == ("died", (1,))
    with pytest.raises(RoleFault) as alone:  # no dead peer shows: the survivor's own report stands
        gather([survivor.lose_peer.remote()], "policy", "train", [survivor], Watchdog(call_timeout_s=60))
    assert (alone.value.kind, alone.value.ranks) == ("died", (0,))
    assert "lost a peer rank inside a collective" in alone.value.cause
    transport.kill(survivor)


def test_the_transport_waits_on_ray_and_in_process_calls_together(workers):
    from gyre.cluster import transport
    from gyre.cluster.local import LocalActor

    actors, _ = workers
    local = LocalActor(Sleeper)
    slow, fast = actors[0].nap.remote(1.0, "ray"), local.nap.remote(0.0, "local")
    ready, rest = transport.wait([slow, fast], num_returns=1, timeout=10)
    assert (ready, rest) == ([fast], [slow])  # the in-process answer first, whatever the order given
    assert transport.wait([slow, fast], num_returns=2, timeout=10) == ([slow, fast], [])
    assert [transport.get(slow), transport.get(fast)] == ["ray", "local"]
    with pytest.raises(transport.CallRaised, match="ValueError: the method's own error"):
        transport.get(actors[0].fail.remote())  # Ray's errors in the same categories as local ones
    with pytest.raises(transport.CallRaised, match="ValueError: the method's own error"):
        transport.get(local.fail.remote())
    transport.kill(local)


def test_a_ray_error_the_caller_caught_itself_is_classified_the_same(workers, ray_local):
    from gyre.cluster.faults import fault_from

    actors, pids = workers
    ref = actors[1].nap.remote(30, 1)
    time.sleep(0.5)
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(ray_local.exceptions.RayActorError) as info:
        ray_local.get(ref, timeout=30)
    fault = fault_from(info.value, "rollout", 1, "generate(train)")
    assert (fault.kind, fault.ranks) == ("died", (1,))


def test_an_actor_whose_constructor_raised_names_the_exception():
    """Ray's report of a failed creation task opens with its own framing; the exception comes last, after
    the traceback's caret markers."""
    from gyre.cluster.faults import _classify_error
    from gyre.cluster.transport import ActorLost

    text = ("The actor died because of an error raised in its creation task, ray::PolicyWorker.__init__() (pid=1)\n"
            "  File \"workers.py\", line 189, in __init__\n    self.copy = self.backend.copy()\n"
            "                ^^^^^^^^^^^^^^^^^^\nAttributeError: 'TrainerBackend' object has no attribute 'hf_model'")
    kind, cause = _classify_error(ActorLost(text, "ActorDiedError"))
    assert kind == "died" and cause.startswith("The actor died because of an error raised in its creation task")
    assert cause.endswith("AttributeError: 'TrainerBackend' object has no attribute 'hf_model'")
    assert _classify_error(ActorLost("The actor was killed", "ActorDiedError")) == ("died", "The actor was killed")
