"""Short GRPO runs with rollout.backend=vllm (synchronous and asynchronous), where vLLM is installed
(``make test-vllm``): the runs train, every weight sync reaches the engine (the sampler's log-probs stay
those of the trainer's weights), and asynchrony stamps stale versions."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (gyre[vllm])")

ENV = dict(os.environ)
"""The environment before any test ran: building a vLLM engine in this process (the conformance suite) sets
variables a child must not inherit (LD_PRELOAD of torch's libgomp makes vLLM's CPU attention see other
thread counts), as a fresh ``gyre`` process would not have them."""
SEPARATE = ["rollout.backend=vllm", "rollout.mode=separate", "rollout.devices=[0]", "policy.devices=[1]",
            "run.steps=4", "sft_warmup.steps=20", "validation.every=0", "checkpoint.every=0", "logging.progress=false"]


def quickstart(out, *overrides) -> list[dict]:
    env = {**ENV, "VLLM_CPU_KVCACHE_SPACE": ENV.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    cmd = [sys.executable, "-m", "gyre.app.cli", "quickstart", "--out", str(out), *SEPARATE, *overrides]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# The synchronous run shares one slot of two threads between policy and engine: the engine steps in the
# actor's serving thread, whose CPU thread count is not the builder's (vLLM's attention checks they agree).
ONE_SLOT = ["cluster.cpu_slots=1", "cluster.threads_per_slot=2", "policy.devices=[0]"]


@pytest.mark.parametrize("overrides", [ONE_SLOT, ["rollout.async_ratio=1"]], ids=["sync-one-slot", "async"])
def test_a_vllm_run_trains_on_the_weights_it_synced(tmp_path, overrides):
    steps = [r for r in quickstart(tmp_path / "run", *overrides) if r.get("phase") == "train" and "time/step" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    for r in steps:
        assert r["batch/samples"] > 0
        # pi_old (trainer) against the sampler's log-probs: equal when the synced weights are the trainer's
        assert r["logprob_mismatch"] < 1e-4, r["logprob_mismatch"]
    if "rollout.async_ratio=1" in overrides:
        assert max(r["staleness/mean"] for r in steps) > 0
