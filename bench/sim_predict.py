"""The simulator side of the cost-model calibration (issue 14): fit a CPU ``DeviceClass`` and a workload
from ONE real run (the synchronous hybrid run) plus the engine microbenchmarks, then predict every
measured setting with ``gyre.sim.scenario`` of that setting's own config and compare.

The fit (``fit_cpu``), in the cost model's own terms (``gyre.sim.cost``, an additive device):

* decoding. A simulated engine spends ``steps x (step_overhead + weights/bw) + row_s x (rows decoded +
  prompt tokens prefilled) + kv_s x (context tokens summed over the steps)`` on a batch. The context
  coefficient ``kv_s`` comes from the engine microbenchmark (the one term a run's few shapes cannot
  separate); the other two are a least-squares fit of the run's *in-run* ``time/generate`` (not the engine
  alone: inside a run Ray streaming, emissions and the other processes make it 2-5x slower, and a
  prediction of a run has to pay what the run pays). Each step's trained samples are split between the
  engines as the scheduler deals groups out (contiguous halves); the engine with more tokens is the step's.
* training: ``time/step - time/generate - time/weight_sync`` (the trainer's side: reward wait, log-probs,
  advantages, collation, the update) against the tokens the step trains per rank with its padding
  (``gyre.sim.run.train_tokens``, the simulator's own count): intercept = ``train_overhead_s``, slope
  sets ``train_mfu`` at the decode fit's peak.
* weight sync: the run's mean ``time/weight_sync``; the link is taken as memory bandwidth (an in-host copy).
* workload: ``fit_lengths`` of the run's metrics (``--calibrate``), the data's prompt lengths, the run's
  logged reward latency and pass rate.

Run alone, it fits and predicts from a stored calibration JSON (the committed one by default), printing only;
``--smoke``: the first pass with one workload seed.

    python bench/sim_predict.py [--json PATH] [--md PATH] [--smoke]
"""

from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from gyre.config.catalog import DeviceClass, ModelShape
from gyre.sim.cost import CostModel
from gyre.sim.run import train_tokens
from gyre.sim.workload import RecordedWorkload, WorkloadSpec, fit_lengths

SIM_SEEDS = (0, 1, 2, 3)
"""Workload seeds each prediction averages over: a 10-step mean of one draw of a long-tailed task is
noisy (whether a step holds a capped sample decides its padding), as the real run's is."""


@dataclass
class CpuFit:
    """What ``fit_cpu`` derives from one run."""

    device: DeviceClass
    workload: WorkloadSpec
    decode: dict[str, float]
    """in_run_scale (in-run time/generate over the engine-alone fit), per_step_s, per_token_s,
    per_ctx_token_s (the engine-alone coefficients times the scale), residual_pct."""
    train: dict[str, float]
    """in_run_scale (the trainer side over the microbenchmark, None without one), overhead_s, per_token_s
    (per rank, padded), residual_pct."""
    params: float = 0.0
    """The model's parameter count the class was fitted with (training seconds scale with it)."""


def _lstsq(xs: list[list[float]], ys: list[float]) -> tuple[list[float], float]:
    """Least squares (an intercept only if ``xs`` carries a column of ones); (coefficients, mean |residual| %).
    Plain squared error, not relative: what is predicted is a mean of step times, and a relative fit
    (``sim_calibration.fit_linear``'s, right for microbenchmark curves) lets the many short steps pull
    the long ones, which dominate the mean, 10-15% low."""
    import torch

    a = torch.tensor(xs, dtype=torch.float64)
    y = torch.tensor(ys, dtype=torch.float64).clamp(min=1e-9)
    sol = torch.linalg.lstsq(a, y[:, None]).solution[:, 0]
    return sol.tolist(), float(((a @ sol - y).abs() / y).mean() * 100)


def engine_parts(groups: list[list], engines: int) -> list[tuple[float, float, float]]:
    """Per engine (groups dealt as contiguous shares): (decode steps, rows decoded + prompt tokens
    prefilled, context tokens summed over the decode steps); finished rows leave the batch."""
    share = -(-len(groups) // engines)
    out = []
    for k in range(engines):
        lens = [(p, r) for p, rs in groups[k * share:(k + 1) * share] for r in rs]
        if not lens:
            continue
        steps = max(r for _, r in lens)
        tokens = sum(r + p for p, r in lens)
        ctx = sum(r * p + r * (r + 1) / 2 for p, r in lens)  # sum over t=1..r of (p + t)
        out.append((steps, tokens, ctx))
    return out


TRAIN_SHAPES = ((128, 4), (128, 8), (128, 16), (128, 32), (128, 68), (64, 68))
"""(rows, tokens per row) of the training microbenchmark: the runs' micro-batches are 128 rows padded to
their longest, from ~5 tokens (short answers) to 68 (a sample at the 64-token cap)."""


def train_microbench(model_path: str, threads: int, repeats: int = 3, shapes=TRAIN_SHAPES) -> list[dict]:
    """Seconds of one update (forward, loss, backward, AdamW step) of the tiny model on the CPU alone, per
    padded micro-batch shape: the training cost's shape (fixed cost against tokens), which one run's
    steps cannot separate when nearly every step pads to the cap."""
    import time

    import torch

    from gyre.models.loading import load_causal_lm

    torch.set_num_threads(threads)
    model = load_causal_lm(model_path)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    gen = torch.Generator().manual_seed(0)
    out = []
    for rows, length in (shapes[0], *shapes):  # the first shape twice: it warms the allocator
        times = []
        for _ in range(repeats):
            ids = torch.randint(3, model.config.vocab_size, (rows, length), generator=gen)
            t0 = time.perf_counter()
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
            times.append(time.perf_counter() - t0)
        out.append({"rows": rows, "length": length, "tokens": rows * length, "seconds": statistics.median(times)})
        print(f"  train {rows:>3} x {length:>2} tokens: {out[-1]['seconds'] * 1e3:7.1f} ms", flush=True)
    return out[1:]


def fit_cpu(run: dict, engine_fit: dict, model: ModelShape, prompt_tokens: list[int],
            train_points: list[dict] | None = None) -> CpuFit:
    """The CPU class and workload of one real run (a ``RunRecord`` as stored), the engine fit's
    coefficients (``decode_step_s``) and the training microbenchmark (``train_microbench``; without it,
    the trainer side's intercept and slope are both fitted from the run)."""
    facts, engines = run["facts"], len(run["facts"]["rollout_devices"])
    shape = (engine_fit["overhead_s"], engine_fit["per_row_s"], engine_fit["per_ctx_token_s"])
    xs, ys = [], []
    for rec, groups in list(zip(run["steps"], run["samples"]))[1:]:  # step 1 warms up
        parts = engine_parts(groups, engines)
        if parts:
            xs.append([max(sum(c * f for c, f in zip(shape, part)) for part in parts)])
            ys.append(rec["time/generate"])
    (scale,), dec_res = _lstsq(xs, ys)
    per_step, per_token, kv_s = (scale * c for c in shape)
    peak = 2 * model.params / per_token / 1e12
    mem_gbps = model.kv_bytes_per_token / kv_s / 1e9
    weights_s = model.weight_bytes / (mem_gbps * 1e9)
    if weights_s > per_step:  # the class's step would cost more than measured; the fit says so in its record
        print(f"warning: reading the weights at the context term's bandwidth takes {weights_s * 1e3:.2f} ms, more "
              f"than the fitted {per_step * 1e3:.2f} ms per step: step_overhead_s clamped to 0")
    ranks = len(facts["policy_devices"])
    tx, ty = [], []
    for rec, groups in list(zip(run["steps"], run["samples"]))[1:]:
        rows = [p + r for p, rs in groups for r in rs]
        if rows:
            tx.append([1.0, train_tokens(rows, "none", facts["micro_batch_size"]) / ranks])
            ty.append(rec["time/step"] - rec["time/generate"] - rec.get("time/weight_sync", 0.0))
    train_scale = None
    if train_points:  # the microbenchmark's shape, scaled to the run (as decoding is)
        (a0, b0), _ = _lstsq([[1.0, p["tokens"]] for p in train_points], [p["seconds"] for p in train_points])
        (train_scale,), train_res = _lstsq([[a0 + b0 * x] for _, x in tx], ty)
        overhead, per_train_token = train_scale * a0, train_scale * b0
    else:
        (overhead, per_train_token), train_res = _lstsq(tx, ty)
    sync = statistics.mean(r.get("time/weight_sync", 0.0) for r in run["steps"][1:])
    device = DeviceClass("cpu", peak, mem_gbps, 8.0, 0.05, compute_eff=1.0, mem_eff=1.0,
                         train_mfu=8 * model.params / (peak * 1e12 * per_train_token),
                         step_overhead_s=max(0.0, per_step - weights_s), train_overhead_s=max(0.0, overhead),
                         link_gbps=mem_gbps, sync_overhead_s=max(0.0, sync - model.weight_bytes / (mem_gbps * 1e9)),
                         additive=True)
    return CpuFit(device, run_workload(run, prompt_tokens),
                  {"in_run_scale": scale, "per_step_s": per_step, "per_token_s": per_token, "per_ctx_token_s": kv_s,
                   "residual_pct": dec_res},
                  {"in_run_scale": train_scale, "overhead_s": overhead, "per_token_s": per_train_token,
                   "residual_pct": train_res}, model.params)


def run_workload(run: dict, prompt_tokens: list[int]) -> WorkloadSpec:
    """The task's shape from the run: lengths by ``fit_lengths`` of its metrics, the data's prompts, its
    logged reward latency (``reward/latency_mean``) and pass rate (``reward/mean``)."""
    steps = run["steps"]
    mean_p = statistics.mean(prompt_tokens)
    latency = [r["reward/latency_mean"] for r in steps if "reward/latency_mean" in r]
    passes = [r["reward/mean"] for r in steps if "reward/mean" in r]
    base = WorkloadSpec(prompt_tokens=mean_p, prompt_tokens_cv=statistics.pstdev(prompt_tokens) / mean_p,
                        reward_latency_s=statistics.mean(latency) if latency else 0.0, reward_latency_cv=0.5,
                        pass_rate=min(0.99, max(0.01, statistics.mean(passes))) if passes else 0.5)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "metrics.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in steps))
        return fit_lengths(path, run["facts"]["max_new_tokens"], base)


def device_literal(d: DeviceClass) -> str:
    """The fitted class as the line ``gyre/sim/cost.py`` holds."""
    return (f'"cpu": DeviceClass("cpu", {d.peak_tflops:.4g}, {d.mem_gbps:.4g}, {d.mem_gb}, {d.price_per_hour}, '
            f"compute_eff=1.0, mem_eff=1.0, train_mfu={d.train_mfu:.4g}, step_overhead_s={d.step_overhead_s:.4g}, "
            f"train_overhead_s={d.train_overhead_s:.4g}, link_gbps={d.link_gbps:.4g}, "
            f"sync_overhead_s={d.sync_overhead_s:.4g}, additive=True),")


# ---- prediction -----------------------------------------------------------------------------------------
def predict_setting(cfg, fit: CpuFit, calibrate: Path, groups: list[list[list]] | None = None,
                    seeds: tuple[int, ...] = SIM_SEEDS) -> dict:
    """Mean seconds per step (and generate, train) over steps 3..N of the simulation of ``cfg`` (a real
    run's config with simulate.* keys), with the fitted class and lengths, averaged over ``seeds``;
    ``groups`` (the calibration run's [prompt tokens, [response tokens]] per step): draw lengths from them
    (``gyre.sim.workload.RecordedWorkload``) instead of the fitted lognormal."""
    from gyre.sim.run import SimRun
    from gyre.sim.scenario import scenario

    out = {"step_s": [], "generate_s": [], "train_s": [], "expired": [], "response_mean": []}
    for seed in seeds:
        spec = scenario(cfg, 2, calibrate=calibrate)
        spec = replace(spec, cost=CostModel(fit.device, spec.cost.model, spec.cost.tp), seed=seed,
                       workload=replace(spec.workload, prompt_tokens=fit.workload.prompt_tokens,
                                        prompt_tokens_cv=fit.workload.prompt_tokens_cv,
                                        reward_latency_s=fit.workload.reward_latency_s,
                                        reward_latency_cv=fit.workload.reward_latency_cv,
                                        pass_rate=fit.workload.pass_rate))
        sim = SimRun(spec)
        if groups is not None:  # the rewards keep the lognormal workload: they read only pass rates, latency
            sim.workload = RecordedWorkload(spec.workload, seed, groups, spec.schedule.batch_groups)
        res = sim.run()
        out["step_s"].append(res.step_s)
        out["generate_s"].append(res.mean("generate_s"))
        out["train_s"].append(res.mean("train_s"))
        out["expired"].append(sum(r.stats.get("rollout/groups_expired", 0) for r in res.steps))
        out["response_mean"].append(sum(r.response_tokens for r in res.measured) / sum(r.samples for r in res.measured))
    return {k: statistics.mean(v) for k, v in out.items()} | {"layout": spec.layout.describe()}


def replay_train_s(run: dict, fit: CpuFit) -> float:
    """The fitted class's training seconds on the run's own trained batches (steps 3..N): the cost model
    alone, with the run's real lengths instead of the simulated workload's."""
    d, ranks = fit.device, len(run["facts"]["policy_devices"])
    per_token = 8 * 1e-12 / (d.peak_tflops * d.train_mfu)  # seconds per token per parameter (fit_cpu's form)
    out = []
    for groups in run["samples"][2:]:
        rows = [p + r for p, rs in groups for r in rs]
        if rows:
            tokens = train_tokens(rows, "none", run["facts"]["micro_batch_size"]) / ranks
            out.append(d.train_overhead_s + per_token * fit.params * tokens)
    return statistics.mean(out) if out else float("nan")


def measured_of(run: dict) -> dict:
    """Measured means over steps 3..N: s/step (and its std over steps), generate, and the trainer side
    (step - generate - weight sync, what the simulator's train_s stands for)."""
    timed = run["steps"][2:]
    step = [r["time/step"] for r in timed]
    return {"step_s": statistics.mean(step), "step_std": statistics.pstdev(step),
            "response_mean": statistics.mean(r["response_length/mean"] for r in timed),
            "generate_s": statistics.mean(r["time/generate"] for r in timed),
            "train_s": statistics.mean(r["time/step"] - r["time/generate"] - r.get("time/weight_sync", 0.0)
                                       for r in timed),
            "expired": sum(r.get("rollout/groups_expired", 0) for r in run["steps"])}


def comparison_rows(runs: list[dict], fit: CpuFit, config_of, calibrate: Path, groups: list[list[list]] | None,
                    seeds: tuple[int, ...] = SIM_SEEDS) -> list[dict]:
    """One row per run: measured against predicted (``config_of(run)`` gives the run's config with the
    simulate.* keys; ``groups``: empirical lengths, see ``predict_setting``)."""
    rows = []
    for run in runs:
        m, p = measured_of(run), predict_setting(config_of(run), fit, calibrate, groups, seeds)
        m["train_replay_s"] = replay_train_s(run, fit)
        rows.append({"setting": run["setting"], "repeat": run.get("repeat", 0), "measured": m, "predicted": p,
                     "error_pct": (p["step_s"] - m["step_s"]) / m["step_s"] * 100})
    return rows


def table(rows: list[dict]) -> str:
    """The comparison as a markdown table."""
    lines = ["| setting | pass | layout (sim) | measured s/step (mean ± std over steps) | predicted | error "
             "| generate meas / pred | train side meas / pred (replay) | trained resp. tokens meas / pred "
             "| groups expired meas / pred |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m, p = r["measured"], r["predicted"]
        lines.append(f"| {r['setting']} | {r['repeat']} | {p['layout']} | {m['step_s']:.3f} ± {m['step_std']:.3f} "
                     f"| {p['step_s']:.3f} | {r['error_pct']:+.1f}% | {m['generate_s']:.3f} / {p['generate_s']:.3f} "
                     f"| {m['train_s']:.3f} / {p['train_s']:.3f} ({m['train_replay_s']:.3f}) "
                     f"| {m['response_mean']:.1f} / {p['response_mean']:.1f} | {m['expired']} / {p['expired']:.0f} |")
    return "\n".join(lines)


def fit_summary(fit: CpuFit) -> str:
    w = fit.workload
    return (f"fitted CPU class: {device_literal(fit.device)}\n"
            f"  decode (in run = {fit.decode['in_run_scale']:.2f} x engine alone): "
            f"{fit.decode['per_step_s'] * 1e3:.3f} ms/step + {fit.decode['per_token_s'] * 1e6:.1f} us/token + "
            f"{fit.decode['per_ctx_token_s'] * 1e9:.0f} ns/context token, "
            f"|resid| {fit.decode['residual_pct']:.1f}%\n"
            f"  train side (in run = {fit.train['in_run_scale'] or float('nan'):.2f} x microbenchmark): "
            f"{fit.train['overhead_s']:.4f} s + {fit.train['per_token_s'] * 1e6:.1f} us/padded token "
            f"per rank, |resid| {fit.train['residual_pct']:.1f}%\n"
            f"  workload: prompt {w.prompt_tokens:.2f} tok (cv {w.prompt_tokens_cv:.2f}), response mean "
            f"{w.response_tokens:.2f} before the cap (sigma {w.length_sigma:.3f}, cap {w.max_tokens}), reward "
            f"latency {w.reward_latency_s * 1e3:.2f} ms, pass rate {w.pass_rate:.2f}")


def fit_record(fit: CpuFit) -> dict:
    return {"device": asdict(fit.device), "workload": asdict(fit.workload), "decode": fit.decode,
            "train": fit.train}


SMOKE = {"seeds": SIM_SEEDS[:1], "passes": 1}


def main() -> None:
    """Fit and predict from a stored calibration JSON (``sim_calibration.py predict``), printing only unless
    ``--md`` names where to write: the committed results are ``sim_calibration.py``'s to rewrite."""
    import argparse

    from sim_calibration import DEFAULT_JSON, predict

    ap = argparse.ArgumentParser(description="fit the simulator's CPU class from a stored calibration run and "
                                             "predict every setting of it")
    ap.add_argument("--json", default=str(DEFAULT_JSON), help="measurements (default: the committed ones)")
    ap.add_argument("--md", default=None, help="also write the comparison here (and its _fits.json beside it)")
    ap.add_argument("--smoke", action="store_true", help="the first pass, one workload seed (SMOKE)")
    args = ap.parse_args()
    predict(json.loads(Path(args.json).read_text()), Path(args.md) if args.md else None,
            **(SMOKE if args.smoke else {}))


if __name__ == "__main__":
    main()
