"""A whole ``gyre train`` run on an environment that raises, hangs, returns junk, floods observations, crashes
its process, kills its worker and fails every episode of one validation seed: each costs an episode
(counted and replaced) or a group (given up), never the run."""

import json
import math
import re
from pathlib import Path

import pytest

from gyre.app import launch
from gyre.config import load_config

HOSTILE = Path(__file__).parents[1] / "envs" / "hostile_envs.py"

FAULTS = {1: "doom", 7: "raise", 9: "hang", 11: "junk", 13: "huge", 18: "crash", 20: "short", 28: "kill_worker"}
"""Reset number in the run -> its fault (``Troublemaker``). Reset 0 is the launcher's check; 1-5 the first
validation (2 seeds, one doomed: its group fails 4 times, then is given up); then each step's batch is 2
groups x 4 episodes, every failed episode replaced once: step 1 is resets 6-16 (3 failures), step 2
17-26 (2 failures), step 3 from 27. No group fails more than env.max_failures times before the worker is
killed, so every fault happens, in the step planned."""


@pytest.mark.slow  # make test-all (CI time); tests/rollout/test_env_driver.py keeps hanging and crashing envs
def test_a_hostile_environment_costs_episodes_never_the_run(ray_local, tiny_model_dir, tmp_path, caplog):
    faults = "{" + ", ".join(f"{n}: {kind}" for n, kind in FAULTS.items()) + "}"
    cfg = load_config(None, [
        f"run.output_dir={tmp_path / 'run'}", "run.steps=3", "run.seed=1", f"model.path={tiny_model_dir}",
        f"env.id={HOSTILE}:Troublemaker", f"env.kwargs={{ledger: {tmp_path / 'ledger'}, faults: {faults}}}",
        "env.workers=2", "env.slots_per_worker=4", "env.step_timeout_s=2", "env.max_failures=3",
        "env.max_turns=3", "env.turn_tokens=8", "env.context_tokens=120", "env.observation_tokens=32",
        "env.val_episodes=2", "validation.every=3", "rollout.devices=[1]", "rollout.prompts_per_step=2",
        "rollout.samples_per_prompt=4", "policy.devices=[0]", "policy.micro_batch_size=4", "logging.progress=false"])
    summary = launch.train(cfg)

    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert records[0]["val/groups_failed"] == records[-1]["val/groups_failed"] == 1  # the doomed seed, left out
    train = records[1:]
    total = {key: sum(r.get(key, 0) for r in train) for key in ("env/failures_error", "env/failures_timeout",
                                                                   "env/failures_invalid", "env/failures_crashed")}
    assert total == {"env/failures_error": 1,  # raise (a step on an environment that lost its episode would add)
                     "env/failures_timeout": 1,  # hang, killed after env.step_timeout_s
                     "env/failures_invalid": 2,  # junk, short
                     "env/failures_crashed": total["env/failures_crashed"]}
    assert train[1]["env/failures_crashed"] == 1  # its process exited
    assert train[2]["env/failures_crashed"] >= 1 and train[2]["fault/env_worker_restarts"] == 1  # its worker died
    assert train[0]["env/observations_cut"] >= 1  # 10M characters, cut to env.observation_tokens
    for r in train:
        assert r["rollout/groups_admitted"] >= 2 and 0 <= r["reward/mean"] <= 1 and math.isfinite(r["pg_loss"])
        assert r["response_length/max"] <= 120
    # The first failure of each kind is shown with its cause, and so is the lost worker.
    shown = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("gyre"))
    for cause in ("(error): step() raised RuntimeError: the environment broke at ",
                  f"(timeout): env '{HOSTILE}:Troublemaker': step() did not return within 2 s",
                  "(invalid): step() returned reward str 'not a number'", "(exit code 3)"):
        assert cause in shown
    assert re.search(r"environment worker \d was lost \(it failed: .+\): [1-4] call\(s\) failed", shown)
    assert summary.final_model is not None and (summary.final_model / "model.safetensors").exists()
