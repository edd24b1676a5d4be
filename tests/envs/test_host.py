"""An environment in its own child process: deadlines, crashes, raises and junk cost one call, never the
host; the child comes back for the next episode."""

from pathlib import Path

import pytest

from gyre.envs.host import EnvSlot, EnvSpec
from gyre.envs.protocol import EnvError, EnvFailure, EnvReset, EnvStep

HOSTILE = Path(__file__).with_name("hostile_envs.py")


def slot(cls="Hostile", **kw):
    return EnvSlot(EnvSpec(f"{HOSTILE}:{cls}", kw, max_observation_chars=1000))


def test_a_well_behaved_episode():
    s = slot("Counter", limit=2)
    assert s.reset(7, 30) == EnvReset("start 7", {"seed": 7, "gyre_latency_s": pytest.approx(0, abs=1)})
    first = s.step("go", 5)
    assert isinstance(first, EnvStep) and first.observation == "step 1" and not first.done
    assert s.step("go", 5).truncated
    s.close()


def test_async_environments_are_awaited():
    s = slot("AsyncCounter")
    assert s.reset(1, 30).observation == "start 1" and s.step("stop", 5).terminated
    s.close()


def test_failures_cost_one_call_and_the_slot_recovers():
    s = slot()
    s.reset(0, 30)
    raised = s.step("raise", 5)
    assert isinstance(raised, EnvFailure) and raised.kind == "error" and "the environment broke" in raised.message
    assert "hostile_envs.py" in raised.message  # where it raised
    junk = s.step("junk", 5)
    assert junk.kind == "invalid" and "finite number" in junk.message
    hung = s.step("hang", 1.0)
    assert hung.kind == "timeout" and s.restarts == 1
    assert s.reset(1, 30).observation == "start 1"  # a fresh child
    crashed = s.step("crash", 5)
    assert crashed.kind == "crashed" and "exit code 3" in crashed.message
    huge = (s.reset(2, 30), s.step("huge", 10))[1]
    assert len(huge.observation) == 1000 and huge.info["gyre_observation_cut"]
    s.close()


def test_a_step_on_a_process_that_lost_its_episode_fails():
    """A fresh slot (a replaced environment worker has only fresh ones) or a restarted child holds no
    episode: stepping it would silently play a fresh environment, so the call fails (its episode is re-run)."""
    s = slot()
    lost = s.step("go", 5)
    assert lost.kind == "crashed" and "holds no episode" in lost.message
    s.reset(0, 30)
    assert s.step("hang", 1.0).kind == "timeout"
    assert s.step("go", 5).kind == "crashed"
    assert s.reset(1, 30).observation == "start 1" and s.step("go", 5).observation == "step 1"
    s.close()


def test_an_environment_that_cannot_be_built_is_a_clear_error():
    with pytest.raises(EnvError, match="BrokenConstructor.* cannot be built with {}: ValueError: no config"):
        slot("BrokenConstructor").reset(0, 30)
    with pytest.raises(EnvError, match="no built-in environment 'nope'"):
        EnvSlot(EnvSpec("gyre:nope", {})).reset(0, 30)


def test_scratch_directories_of_processes_that_are_gone_are_swept(tmp_path, monkeypatch):
    """An environment worker killed outright cannot remove its children's scratch: the next slot started on the
    machine does, and leaves a live process's alone."""
    import os
    import subprocess
    import sys
    import tempfile

    from gyre.envs.host import SCRATCH_PREFIX, sweep_scratch

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tmp_path / f"{SCRATCH_PREFIX}{int(gone.stdout)}-abc"
    (dead / "gyre-workspace-x").mkdir(parents=True)
    alive = tmp_path / f"{SCRATCH_PREFIX}{os.getpid()}-def"
    alive.mkdir()
    other = tmp_path / "gyre-env-notapid"
    other.mkdir()
    assert sweep_scratch() == 1
    assert not dead.exists() and alive.exists() and other.exists()
