"""A real run whose rollout pool grows from one engine to two and back while it trains (rollout.elastic):
the lent engine is a Ray actor started outside the run's devices, takes the weights, samples, and is taken
back with its unfinished samples handed back; the trained-sample ledger accounts for every prompt once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gyre.rollout.ledger import audit, summary
from gyre.tracking.logger import read_jsonl_tolerant

STEPS = 10


def _records(run: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (run / name).read_text().splitlines()]


@pytest.mark.timeout(600)
def test_the_pool_grows_and_shrinks_during_a_run_with_nothing_lost(ray_local, tiny_model_dir, arithmetic_data,
                                                                     tmp_path):
    from gyre.app import launch
    from gyre.config import load_config

    out = tmp_path / "elastic"
    reward = Path(__file__).parent / "reward_fns.py"
    cfg = load_config(None, [
        f"run.output_dir={out}", f"run.steps={STEPS}", "run.max_restarts=0", f"model.path={tiny_model_dir}",
        f"data.train_files=[{arithmetic_data['train']}]", "policy.devices=[0]", "rollout.devices=[1]",
        "rollout.prompts_per_step=8", "rollout.samples_per_prompt=4", "rollout.sampling.max_new_tokens=48",
        # Asynchronous: engines may owe samples when the lent one is taken back at step 8's start.
        "rollout.async_ratio=1", "policy.micro_batch_size=32", "policy.optimizer.lr=0.01",
        "rollout.elastic={max_engines: 2, notice_s: 0, wait_for_joins: true, "
        "schedule: [{step: 2, engines: 2}, {step: 8, engines: 1}]}",
        "reward.type=function", f"reward.function={reward}:digit_fraction", "logging.progress=false",
        "logging.trackers=[]", "logging.plot=false"])
    launch.train(cfg, echo=lambda s: None)

    steps = [r for r in _records(out, "metrics.jsonl") if r.get("step", 0) > 0]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    last = steps[-1]
    assert last["elastic/joins"] == 1 and last["elastic/leaves"] == 1 and last["elastic/join_failures"] == 0
    # Step 2 waited for the lent engine; step 8 took it back (at once, handing back what it held).
    assert [r["rollout/engines"] for r in steps] == [1] + [2] * 6 + [1] * 3
    assert all(r["batch/samples"] == 32 for r in steps)
    # The lent engine (rollout rank 1) decoded samples while it was in the pool.
    spans = _records(out, "timeline.jsonl")
    assert any(s["role"] == "rollout" and s["rank"] == 1 and s["phase"] == "generate" for s in spans)
    # Every prompt drawn was trained once, or is pending at the end: none lost, none trained twice.
    ledger = read_jsonl_tolerant(out / "ledger.jsonl")
    assert audit(ledger) == [], audit(ledger)[:5]
    assert summary(ledger)["trained"] == 8 * STEPS
