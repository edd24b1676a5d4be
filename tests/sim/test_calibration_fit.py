"""bench/sim_predict.py: the CPU class fitted from one run recovers the costs a synthetic run was made of."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from sim_predict import engine_parts, fit_cpu  # noqa: E402

from gyre.config.catalog import ModelShape  # noqa: E402
from gyre.sim.cost import CostModel  # noqa: E402
from gyre.sim.run import train_tokens  # noqa: E402

ENGINE = {"overhead_s": 1e-3, "per_row_s": 3e-5, "per_ctx_token_s": 6e-7}
MODEL = ModelShape("t", 1e5, 2, 2, 16)
"""Small enough that reading its weights at the KV term's bandwidth (0.94 ms) fits in the 2 ms step overhead."""


def test_engine_parts_by_hand():
    groups = [[2, [3, 1]], [4, [2]]]
    # one engine: 3 steps; tokens (3+2)+(1+2)+(2+4) = 14; context sum_t (p+t): 2+3+4+5 + 3 + 5+6 = 28 - 2 = 26
    assert engine_parts(groups, 1) == [(3, 14, 26)]
    assert engine_parts(groups, 2) == [(3, 8, 15), (2, 6, 11)]


def synthetic_run(steps: int = 8) -> dict:
    """Generate = 2x the engine-alone cost of the slower engine; trainer side = 0.05 s + 6e-5 s per padded
    token per rank; weight sync 3 ms."""
    records, samples = [], []
    for k in range(steps):
        groups = [[4, [3 + (k * 7 + g) % 11, 2 + (k + g) % 5]] for g in range(4)] + [[5, [20 + 3 * k, 6]]]
        parts = engine_parts(groups, 2)
        gen = 2 * max(sum(c * f for c, f in zip(ENGINE.values(), p)) for p in parts)
        rows = [p + r for p, rs in groups for r in rs]
        trainer = 0.05 + 6e-5 * train_tokens(rows, "none", 4) / 2
        lens = [r for _, rs in groups for r in rs]
        records.append({"step": k + 1, "time/generate": gen, "time/weight_sync": 0.003,
                        "time/step": gen + trainer + 0.003, "response_length/mean": sum(lens) / len(lens),
                        "response_length/max": max(lens), "batch/samples": len(lens)})
        samples.append(groups)
    facts = {"rollout_devices": [0, 1], "policy_devices": [0, 1], "micro_batch_size": 4, "max_new_tokens": 64}
    return {"facts": facts, "steps": records, "samples": samples}


def test_fit_recovers_the_synthetic_costs():
    fit = fit_cpu(synthetic_run(), ENGINE, MODEL, [4, 4, 5, 4])
    assert fit.decode["in_run_scale"] == pytest.approx(2.0, rel=1e-6)
    assert fit.train["overhead_s"] == pytest.approx(0.05, rel=1e-6)
    assert fit.train["per_token_s"] == pytest.approx(6e-5, rel=1e-6)
    cost = CostModel(fit.device, MODEL)
    # the class's decode step is the in-run cost: 2 x (1 ms + 30 us per row + 0.6 us per context token)
    assert cost.decode_step_s(10, 100) == pytest.approx(2 * (1e-3 + 10 * 3e-5 + 100 * 6e-7), rel=1e-6)
    # training (one forward pass besides the update) on 2 devices: 0.05 s + 6e-5 s per token per rank
    assert cost.train_s(2000, 2, 4) == pytest.approx(0.05 + 6e-5 * 1000, rel=1e-6)
    assert cost.sync_s() == pytest.approx(0.003, rel=1e-6)
    assert fit.workload.prompt_tokens == pytest.approx(4.25)


def test_fit_scales_the_training_microbenchmark():
    """With a microbenchmark of 0.025 s + 3e-5 s per token, the in-run trainer side (0.05 + 6e-5 x) is
    twice it: one scale, whatever the run's token spread."""
    bench = [{"tokens": t, "seconds": 0.025 + 3e-5 * t} for t in (512, 2048, 8704)]
    fit = fit_cpu(synthetic_run(), ENGINE, MODEL, [4, 4, 5, 4], bench)
    assert fit.train["in_run_scale"] == pytest.approx(2.0, rel=1e-6)
    assert fit.device.train_overhead_s == pytest.approx(0.05, rel=1e-6)
    assert CostModel(fit.device, MODEL).train_s(2000, 2, 4) == pytest.approx(0.05 + 6e-5 * 1000, rel=1e-6)
