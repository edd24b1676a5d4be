"""gyre.sim.calibrate: the device, prompts, reward latency and lengths fitted from a run directory, checked
against numbers worked out by hand from a synthetic run, and read from a real tiny run."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from gyre.app.cli import main
from gyre.config import load_config
from gyre.config.catalog import DeviceClass, ModelShape, device_class
from gyre.config.report import resolved_yaml
from gyre.sim.calibrate import (
    FAST_BANDWIDTH_GBPS,
    DecodeFit,
    RunRecords,
    base_decode_s,
    calibrate,
    decode_features,
    decode_figures,
    fit_decode,
    nonneg_lstsq,
)
from gyre.sim.cost import CostModel
from gyre.sim.scenario import calibration, scenario
from gyre.tracking.timeline import Span

A, B = 2e-3, 1e-4
"""The synthetic engine: 2 ms a decoding step, 100 us a token prefilled or decoded."""
GROUPS = {1: [(2, (5, 5)), (4, (5, 5))], 2: [(2, (3, 1)), (4, (2, 2))], 3: [(2, (6, 2)), (4, (1, 1))],
          4: [(2, (4, 4)), (4, (8, 1))], 5: [(2, (2, 2)), (4, (3, 5))]}
"""Per step: (prompt tokens, the response tokens of its two samples) of its two groups; prompt "ab" is 2
tokens and "abcd" 4 under the tiny model's character tokenizer."""
FEATURES = {2: (3, 10.0), 3: (6, 11.0), 4: (8, 14.5), 5: (5, 12.0)}
"""By hand, [longest response, sum(p + r) / 2 engines]: step 2's samples (p, r) = (2, 3), (2, 1), (4, 2), (4, 2):
tokens 5 + 3 + 6 + 6 = 20, 10 an engine; step 4's (2, 4), (2, 4), (4, 8), (4, 1): 6 + 6 + 12 + 5 = 29."""
BUSY = {s: A * f[0] + B * f[1] for s, f in FEATURES.items()}
"""The slower engine's seconds a step: step 2 is 6 ms + 1 ms = 7 ms."""
TRAIN_RATE, TRAIN_FIXED, DRIVER_S = 1e9, 0.05, 0.03
"""The stub learner charges 1e6 FLOPs a token; the trainer spans are 50 ms + FLOPs at 1 GFLOP/s, and the
driver spends 30 ms more a step (collation, advantages)."""


def test_nonnegative_least_squares_by_hand():
    assert nonneg_lstsq([[1, 0], [0, 1], [1, 1]], [1, 2, 3])[0] == pytest.approx([1, 2])
    # y = 4 - x fits exactly, but a negative slope is refused: a constant (the mean, 2; squared error 2) beats a
    # slope alone (b = sum(x y) / sum(x^2) = 10/14; squared error 6.86)
    coef, residual = nonneg_lstsq([[1, 1], [1, 2], [1, 3]], [3, 2, 1])
    assert coef == pytest.approx([2, 0]) and residual == pytest.approx((1 / 3 + 0 + 1) / 3 * 100)


def test_decode_features_by_hand():
    assert decode_features(GROUPS[2], 2) == pytest.approx(FEATURES[2])
    assert decode_features(GROUPS[4], 2) == pytest.approx(FEATURES[4])
    assert decode_features([(2, (3, 1)), (-1, (2,))], 1) == pytest.approx([3, 5 + 3 + 2])  # an unknown prompt: 0


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def synthetic_run(run_dir: Path, model_dir: str, timeline: bool = True) -> Path:
    """A 5-step synchronous hybrid run on two policy ranks, costed as the module constants say (step 1, the
    warm-up, is 10x slower everywhere and must be left out)."""
    data = run_dir / "data" / "train.jsonl"
    data.parent.mkdir(parents=True)
    _jsonl(data, [{"prompt": "ab", "ground_truth": "a"}, {"prompt": "abcd", "ground_truth": "a"}])
    cfg = load_config(None, [f"model.path={model_dir}", f"data.train_files=[{data}]", "rollout.prompts_per_step=2",
                             "rollout.samples_per_prompt=2", "rollout.mode=hybrid", "rollout.devices=[0,1]",
                             "policy.devices=[0,1]", "rollout.sampling.max_new_tokens=8"])
    (run_dir / "resolved_config.yaml").write_text(resolved_yaml(cfg))
    uids = [f"{data}:1", f"{data}:2"]
    _jsonl(run_dir / "ledger.jsonl", [{"step": 0, "pending": []}] + [
        {"step": s, "drawn": uids, "trained": [{"uid": u, "group": f"train-{s}-{i}", "versions": [s - 1],
                                                "rewards": [0.0, 1.0], "lengths": list(g[1])}
                                               for i, (u, g) in enumerate(zip(uids, GROUPS[s]))]} for s in GROUPS])
    metrics, spans, t = [], [], 1000.0
    sync = {1: 0.5, 2: 0.002, 3: 0.004, 4: 0.003, 5: 0.003}
    for s in GROUPS:
        slow = 10.0 if s == 1 else 1.0
        busy, flops = BUSY.get(s, 0.1) * slow, 1e6 * sum(p + r for p, rs in GROUPS[s] for r in rs)
        train = (TRAIN_FIXED + flops / TRAIN_RATE) * slow
        for rank, share in ((0, 1.0), (1, 0.5)):
            spans += [{"role": "policy", "rank": rank, "phase": "generate", "start": t, "end": t + busy * share,
                       "step": s},
                      {"role": "policy", "rank": rank, "phase": "train", "start": t + busy, "end": t + busy + train,
                       "step": s}]
        rewards = {1: [1.0], 2: [0.01, 0.03], 3: [0.02]}.get(s, [])
        spans += [{"role": "reward", "rank": 0, "phase": "reward", "start": t + i, "end": t + i + d, "step": s}
                  for i, d in enumerate(rewards)]
        step_s = busy + sync[s] + 0.001 + flops / TRAIN_RATE + TRAIN_FIXED + DRIVER_S
        metrics.append({"step": s, "time/step": step_s, "time/generate": busy + 0.0005, "time/weight_sync": sync[s],
                        "time/reward": 0.001, "batch/samples": 4, "response_length/mean": 3.0,
                        "response_length/max": 8.0, "response_length/truncated_frac": 0.0})
        t += 100.0
    _jsonl(run_dir / "metrics.jsonl", metrics)
    if timeline:
        _jsonl(run_dir / "timeline.jsonl", spans)
    return run_dir


class _StubLearner:
    def step_flops(self, rows, step, groups=None):
        return 1e6 * sum(rows)


@pytest.fixture
def stub_learner(monkeypatch):
    """The learner's FLOPs made simple (1e6 a token): the fit, not gyre.sim.learner, is under test here."""
    monkeypatch.setattr("gyre.sim.learner.sim_learner", lambda cfg, ranks, shape: _StubLearner())


def test_the_device_and_task_fitted_from_a_synthetic_run_by_hand(tmp_path, tiny_model_dir, stub_learner):
    run = synthetic_run(tmp_path / "run", str(tiny_model_dir))
    shape = ModelShape.from_hf_config(tiny_model_dir)
    # the tiny preset: hidden 128, 2 layers of 4 heads of 32 (4 KV heads), MLP 256, vocabulary 101, tied:
    # 2 x (128*32*16 + 3*128*256) + 101*128 = 340608 parameters; KV 2*2*4*32*2 = 1024 bytes a token
    assert (shape.params, shape.kv_bytes_per_token, shape.weight_bytes) == (340608, 1024, 681216)
    cal = calibrate(run, device_class("cpu"), shape)
    d = cal.device
    # decoding: peak = 2 P / b = 681216 / 1e-4 FLOP/s (6.8 GFLOP/s); the step's fixed cost is a; reading (the
    # KV per context token, not fitted) costs nothing extra
    assert d.peak_tflops == pytest.approx(681216 / 1e-4 / 1e12)
    assert d.step_overhead_s == pytest.approx(A) and d.mem_gbps == FAST_BANDWIDTH_GBPS
    assert d.additive and d.compute_eff == d.mem_eff == 1.0 and d.name == "cpu, fitted"
    # training at 1 GFLOP/s = train_mfu x peak; the fixed cost: step - busy - sync - reward - FLOPs / rate
    assert d.train_mfu * d.peak_tflops * 1e12 == pytest.approx(TRAIN_RATE)
    assert d.train_overhead_s == pytest.approx(TRAIN_FIXED + DRIVER_S)
    # hybrid moves no weights: call_s is the mean sync of steps 2-5, (2 + 4 + 3 + 3) / 4 ms
    assert d.call_s == pytest.approx(0.003)
    assert (d.mem_gb, d.price_per_hour) == (device_class("cpu").mem_gb, device_class("cpu").price_per_hour)
    # prompts 2 and 4 tokens, one group each a step: mean 3, std 1; reward spans 10, 30, 20 ms past step 1
    assert cal.prompts == pytest.approx((3.0, 1 / 3)) and cal.reward_s == pytest.approx(0.02)
    assert cal.recorded[1] == ((2, (3, 1)), (4, (2, 2)))
    report = cal.report()
    for text in ("generate spans: 8 of 2 engine(s) over 4 steps", "train/log-prob spans: 8 over 4 steps",
                 "3.00 ms a sync (time/weight_sync of 4 steps", "links not fitted", "the median of 3 reward spans",
                 "KV read per context token not separable", "its spread not fitted",
                 "mean 3.0 tokens, cv 0.33 (10 trained groups' prompts)", "10 trained groups of 5 steps replayed"):
        assert text in report, text


def test_the_simulation_runs_on_the_fitted_device(tmp_path, tiny_model_dir, stub_learner, capsys):
    run = synthetic_run(tmp_path / "run", str(tiny_model_dir))
    cfg = load_config(run / "resolved_config.yaml", ["simulate.model=config", "simulate.device=cpu",
                                                     "simulate.devices=2", "simulate.steps=4",
                                                     "simulate.warmup_steps=1"])
    spec = scenario(cfg, 2, calibrate=run)
    assert spec.cost.device is calibration(cfg, run).device  # cached: one fit per run, every setting
    # the cost model's decoding is the fit: 3 steps of 4 rows cost 3 a + 12 b, whatever their context
    assert spec.cost.decode_span_s(4, 10, 3) == pytest.approx(3 * A + 12 * B)
    assert spec.cost.decode_span_s(4, 1000, 3) == pytest.approx(3 * A + 12 * B)
    assert (spec.workload.prompt_tokens, spec.workload.reward_latency_s) == pytest.approx((3.0, 0.02))
    assert spec.workload.reward_latency_cv == cfg.simulate.workload.reward_latency_cv  # not fitted
    assert main(["simulate", str(run / "resolved_config.yaml"), "simulate.model=config", "simulate.device=cpu",
                 "simulate.devices=2", "simulate.steps=4", "simulate.warmup_steps=1", "--calibrate", str(run),
                 "--out", str(tmp_path / "sweep")]) == 0
    out = capsys.readouterr().out
    assert f"calibrated from {run.resolve()}" in out and "generate spans: 8 of 2 engine(s)" in out
    assert "device     cpu, fitted" in out


def test_what_cannot_be_fitted_is_said(tmp_path, tiny_model_dir, stub_learner, capsys):
    run = synthetic_run(tmp_path / "run", str(tiny_model_dir), timeline=False)
    cal = calibrate(run, device_class("cpu"), ModelShape.from_hf_config(tiny_model_dir))
    report = cal.report()
    assert "decoding    not fitted: no generate spans" in report
    assert "training    not fitted" in report and "rewards     latency not fitted" in report
    assert cal.reward_s is None and cal.prompts == pytest.approx((3.0, 1 / 3))  # the ledger and data still tell
    # without a decode or training fit the device keeps the base class's speed; the sync is still measured
    assert cal.device.peak_tflops == device_class("cpu").peak_tflops and cal.device.call_s == pytest.approx(0.003)
    # a metrics.jsonl alone: lengths only, and said so
    cfg = load_config(run / "resolved_config.yaml", ["simulate.model=config", "simulate.device=cpu",
                                                     "simulate.devices=2", "simulate.steps=3"])
    assert main(["simulate", str(run / "resolved_config.yaml"), "simulate.model=config", "simulate.device=cpu",
                 "simulate.devices=2", "simulate.steps=3", "--calibrate", str(run / "metrics.jsonl"),
                 "--out", str(tmp_path / "sweep")]) == 0
    assert "lengths only (a metrics.jsonl)" in capsys.readouterr().out
    assert scenario(cfg, 2, calibrate=run / "metrics.jsonl").cost.device == device_class("cpu")


def test_an_asynchronous_run_gives_a_decode_throughput_only():
    # two engines' generate spans over steps 2-3 (step 1 left out): 0.3 + 0.2 + 0.5 s = 1.0 s busy, for the
    # tokens generated (300 + 500) and the prompts of the groups admitted (2 + 3 groups of 2 samples, prompts
    # of mean 3 tokens: 30) -> 1.0 s / 830 tokens
    spans = [Span("rollout", 0, "generate", 0.0, 9.0, 1), Span("rollout", 0, "generate", 0.0, 0.3, 2),
             Span("rollout", 1, "generate", 0.0, 0.2, 2), Span("rollout", 0, "generate", 0.0, 0.5, 3)]
    steps = {s: {"rollout/tokens_generated": n, "rollout/groups_admitted": k}
             for s, n, k in ((1, 999, 9), (2, 300, 2), (3, 500, 3))}
    groups = {s: [(2, (1, 1)), (4, (1, 1))] for s in (1, 2, 3)}
    fit = fit_decode(RunRecords(Path("."), steps, spans, groups, None), sync=False, cost=BASE)
    assert isinstance(fit, DecodeFit) and fit.mode == "throughput" and "asynchronous" in fit.why
    assert fit.per_token_s == pytest.approx(1.0 / 830) and (fit.steps, fit.spans, fit.engines) == (2, 3, 2)


BASE = CostModel(DeviceClass("t", 2e-3, 0.256, 8.0, 1.0, compute_eff=1.0, mem_eff=1.0, step_overhead_s=1e-3,
                             additive=True, kind="cpu"), ModelShape("t", 1e5, 2, 2, 16))
"""A base class whose engine costs, for a model of 1e5 parameters (2e5 bytes, 256 bytes of KV a token): a row
2 P / 2 GFLOP/s = 100 us, a context token 256 B / 0.256 GB/s = 1 us, the weights 2e5 / 0.256e9 = 781.25 us a
step, plus 1 ms."""


def test_the_base_class_engine_priced_on_a_steps_samples_by_hand():
    # (p, r) = (2, 3), (2, 1), (4, 2) on one engine: prefill 8 tokens (800 us + the weights' 781.25 us); step 1
    # reads 3 rows, context 8 + 3 = 11; step 2: 2 rows (the 1-token sample left), 6 + 4 = 10; step 3: 1 row, 2 + 3
    steps = [1e-3 + 781.25e-6 + rows * 1e-4 + context * 1e-6 for rows, context in ((3, 11), (2, 10), (1, 5))]
    expected = 800e-6 + 781.25e-6 + sum(steps)
    assert expected == pytest.approx(7.551e-3)
    groups = [(2, (3, 1)), (4, (2,))]
    assert base_decode_s(groups, 1, BASE) == pytest.approx(expected)
    # two engines take half the rows and half the context each step
    half = 400e-6 + 781.25e-6 + sum(1e-3 + 781.25e-6 + rows / 2 * 1e-4 + context / 2 * 1e-6
                                    for rows, context in ((3, 11), (2, 10), (1, 5)))
    assert base_decode_s(groups, 2, BASE) == pytest.approx(half)


def test_a_run_that_cannot_tell_a_step_from_a_token_scales_the_base_class():
    # two steps past the first cannot give a two-term fit standard errors: the spans are 1.5x the base class's
    # seconds for each step's samples, and the fitted device prices them at exactly that
    groups = {1: [(2, (9, 9))], 2: [(2, (3, 1)), (4, (2,))], 3: [(2, (5, 1)), (4, (2,))]}
    spans = [Span("rollout", 0, "generate", 0.0, 1.5 * base_decode_s(groups[s], 1, BASE), s) for s in (2, 3)]
    fit = fit_decode(RunRecords(Path("."), {}, spans, groups, None), sync=True, cost=BASE)
    assert fit.mode == "scale" and fit.scale == pytest.approx(1.5) and "not told apart" in fit.why
    device = replace(BASE.device, **decode_figures(fit, BASE.device, BASE.model, "hf"))
    assert device.step_overhead_s == pytest.approx(1.5e-3) and device.peak_tflops == pytest.approx(2e-3 / 1.5)
    assert base_decode_s(groups[2], 1, CostModel(device, BASE.model)) == pytest.approx(1.5 * 7.551e-3)


def test_calibrating_from_a_real_tiny_run(trained_run):
    """The 2-step GRPO run of conftest.py (a rollout engine beside two FSDP2 ranks): one step past the first
    gives decoding a scale of the base class, and training nothing, and the report says so."""
    cfg = load_config(trained_run / "resolved_config.yaml", ["simulate.model=config", "simulate.device=cpu",
                                                             "simulate.devices=3", "simulate.steps=2",
                                                             "simulate.warmup_steps=1"])
    cal = calibration(cfg, trained_run)
    report = cal.report()
    # one step past the first cannot tell a step's cost from a token's: the base class's engine, scaled
    assert "x the base class's seconds for the same samples (generate spans:" in report
    assert "of 1 engine(s) over 1 steps" in report and "standard errors inf%, inf%" in report
    assert "training    not fitted: fewer than two steps" in report
    assert "transport channel" in report  # the engine is beside the ranks: the weights crossed the channel
    assert cal.prompts is not None and cal.prompts[0] > 0 and "(4 trained groups' prompts)" in report
    assert cal.recorded is not None and len(cal.recorded) == 2
    spec = scenario(cfg, 3, calibrate=trained_run)
    assert spec.cost.device is cal.device and spec.workload.prompt_tokens == cal.prompts[0]
