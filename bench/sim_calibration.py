"""The simulator's calibration on this machine's CPU (issues 14, 27): real runs of the tiny model, the
simulator calibrated from one of them, and its predictions of the others.

``both`` (what the README's table comes from) trains the synchronous setting (sync-hybrid) and two
others (default: async-2, window asynchrony, and lockstep-2) with the real ``launch.train`` from one warm
start, in one sitting (the machine's speed drifts between sittings); calibrates the simulator from the
sync run's *directory alone* (``gyre.sim.calibrate``: the device's decode, training and weight-sync
speed from its timeline's spans, prompt lengths, reward latency, its trained groups' lengths), exactly as
``gyre simulate --calibrate RUN_DIR`` does; predicts every setting with ``gyre simulate``'s own path
(``scenario(cfg, calibrate=sync_dir)`` of each run's resolved config, averaged over workload seeds) and
prints measured against predicted with the 25% target. A diagnostic column replays each run's *own*
trained lengths on the same fitted device (how much of the error is the machine, how much the lengths a
schedule's learning produces, which no calibration run can know). ``--repeats`` passes, each calibrated
from its own sync run; ``--md PATH`` also writes the table.

``measure`` / ``report`` / ``predict`` are the older microbenchmark path (issue 14): four schedules, the HF
engine and trainer measured alone, linear fits, and ``bench/sim_predict.py``'s hand-fitted CPU class,
stored in ``bench/results/sim_calibration_real.json``.

    python bench/sim_calibration.py both [--steps 12] [--repeats 1] [--only sync-hybrid async-2 lockstep-2]
    python bench/sim_calibration.py measure [--steps 12] [--repeats 1] [--out DIR] [--json PATH]
    python bench/sim_calibration.py report [--json PATH]    # re-fit and re-print a stored JSON
    python bench/sim_calibration.py predict [--json PATH] [--md PATH]
    python bench/sim_calibration.py --smoke    # `both` at its smallest (BOTH_SMOKE), in a temporary directory
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout_schedules import COMMON, SCHEDULES, shared_keys, warm_start  # noqa: E402
from sim_predict import SIM_SEEDS, TRAIN_SHAPES, fit_cpu, train_microbench  # noqa: E402

SETTINGS = ("sync-hybrid", "queue-hybrid", "tail-hybrid", "async-2")
KEPT_PREFIXES = ("time/", "batch/", "response_length/", "staleness/", "rollout/", "reward/")
DECODE_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DECODE_PROMPTS = (8, 32, 128)
"""Prompt lengths of the engine sweep: the repeat task's prompts are ~5 tokens, its contexts reach ~70."""
# Single steps take 1-60 ms on a shared VM: medians over many keep the sweep's points within a few percent.
WARMUP_STEPS, TIMED_STEPS, PREFILL_REPEATS = 2, 16, 5
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "sim_calibration_real.json"
DEFAULT_MD = Path(__file__).resolve().parent / "results" / "sim_calibration.md"


@dataclass(frozen=True)
class Sizes:
    """How much ``measure`` does besides the runs themselves."""

    decode_rows: tuple[int, ...] = DECODE_ROWS
    decode_prompts: tuple[int, ...] = DECODE_PROMPTS
    timed_steps: int = TIMED_STEPS
    prefill_repeats: int = PREFILL_REPEATS
    train_shapes: tuple[tuple[int, int], ...] = TRAIN_SHAPES
    train_repeats: int = 3
    shape_repeats: int = 6
    sft_steps: int = 40


@dataclass
class LinearFit:
    """Least-squares fit of seconds against named features, with its residuals."""

    target: str
    coef: dict[str, float]
    """Feature name -> seconds per unit ("overhead_s" is the intercept)."""
    points: int
    residual_rms_s: float
    residual_mean_abs_pct: float
    """Mean |measured - fitted| / measured, in percent."""
    residual_max_abs_pct: float


@dataclass
class EnginePoint:
    """One (rows, prompt length) point of the rollout engine sweep."""

    rows: int
    prompt_tokens: int
    decode_step_s: float
    """Median seconds of one ``engine.step()`` (sample + decode forward) after the warm-up steps."""
    decode_step_std_pct: float
    """Spread of the timed steps (std / mean, percent)."""
    context_tokens: float
    """Tokens held in the cache over all rows, averaged over the timed steps."""
    prefill_s: float
    """Median over repeats of (first step - median decode step): the admission prefill of every row."""
    prefill_tokens: int


@dataclass
class ShapePoint:
    """The engine alone (no Ray) on one engine's share of a real sync-hybrid step: half the step's prompts,
    ``samples_per_prompt`` each, the runs' max_new_tokens, sampled by the sync run's final model."""

    seconds: float
    decode_steps: int
    samples: list[list]
    """Per group: [prompt tokens, [response tokens of each sample]]."""


@dataclass
class RunRecord:
    """One real training run: its resolved settings, per-step records and trained samples."""

    setting: str
    overrides: list[str]
    facts: dict
    """What the simulator needs from the resolved config (sizes, devices, schedule, alpha, eta, threads)."""
    wall_s: float
    steps: list[dict]
    """metrics.jsonl train records, reduced to step, time and the KEPT_PREFIXES keys."""
    samples: list[list[list]]
    """Per step, per trained group: [prompt tokens, [response tokens of each sample]]."""
    loadavg: list[float]
    """The machine's 1-minute load average before and after the run (it uses 2 cores: much above 2 means
    something else competed for the CPU, and its timings are slower than this machine's own)."""
    repeat: int = 0
    """Which pass over the settings this run belongs to (``--repeats``: settings interleaved per pass)."""


def fit_linear(target: str, names: list[str], xs: list[list[float]], ys: list[float]) -> LinearFit:
    """Least squares with an intercept (``overhead_s``) on relative error: each point is divided by its
    measured seconds, so a 1 ms decode step counts as much as a 60 ms one (the simulator sums many small
    steps, and a plain fit would serve only the largest)."""
    import torch

    a = torch.tensor([[1.0, *x] for x in xs], dtype=torch.float64)
    y = torch.tensor(ys, dtype=torch.float64).clamp(min=1e-9)
    sol = torch.linalg.lstsq(a / y[:, None], torch.ones_like(y)[:, None]).solution[:, 0]
    fitted = a @ sol
    rel = ((y - fitted).abs() / y * 100).tolist()
    return LinearFit(target, dict(zip(["overhead_s", *names], sol.tolist())), len(ys),
                     float(((y - fitted) ** 2).mean().sqrt()), statistics.mean(rel), max(rel))


# ---- real runs ----------------------------------------------------------------------------------------------
def run_config(name: str, model: str, data: dict, out: Path, steps: int, seed: int, extra: tuple[str, ...] = ()):
    from gyre.config import load_config

    return load_config(None, [f"run.output_dir={out}", f"run.steps={steps}", f"run.seed={seed}",
                              f"model.path={model}", f"data.train_files=[{data['train']}]",
                              f"data.val_files=[{data['val']}]", "validation.every=0", "logging.generations_every=1",
                              "logging.generations_samples=100000", "logging.report=false", *COMMON,
                              *shared_keys("short"), *SCHEDULES[name], *extra])


def facts_of(cfg) -> dict:
    """The resolved settings a simulator of this run needs."""
    r, tail = cfg.rollout, cfg.rollout.tail_batching
    return {"prompts_per_step": r.prompts_per_step, "samples_per_prompt": r.samples_per_prompt,
            "max_new_tokens": r.sampling.max_new_tokens, "rollout_devices": list(r.devices),
            "policy_devices": list(cfg.policy.devices), "mode": r.mode, "schedule": r.schedule,
            "async_ratio": r.async_ratio, "async_mode": r.async_mode, "partial": r.partial,
            "max_batch_size": r.max_batch_size, "emit_every": r.emit_every,
            "tail_batching": None if tail is None else {"eta_prompts": tail.eta_prompts,
                                                        "eta_samples": tail.eta_samples},
            "micro_batch_size": cfg.policy.micro_batch_size, "cpu_slots": cfg.cluster.cpu_slots,
            "threads_per_worker": cfg.cluster.threads_per_slot, "seed": cfg.run.seed, "steps": cfg.run.steps}


def trained_samples(run_dir: Path, steps: int, prompt_len: dict[str, int]) -> list[list[list]]:
    """Every trained sample's lengths from generations/step_<N>.jsonl (all of them: generations_samples is
    set above the batch size), grouped as the step trained them."""
    out = []
    for step in range(1, steps + 1):
        path = run_dir / "generations" / f"step_{step}.jsonl"
        groups: dict[str, list] = {}
        for line in path.read_text().splitlines() if path.exists() else []:
            g = json.loads(line)
            entry = groups.setdefault(g["group"], [prompt_len.get(g["prompt"], -1), []])
            entry[1].append(g["response_tokens"])
        out.append(list(groups.values()))
    return out


def run_setting(name: str, model: str, data: dict, out: Path, steps: int, seed: int,
                prompt_len: dict[str, int], repeat: int = 0) -> RunRecord:
    """Train one setting with the real launcher and collect what the calibration needs from its run dir."""
    from gyre.app import launch

    cfg = run_config(name, model, data, out, steps, seed)
    load_before, t0 = os.getloadavg()[0], time.perf_counter()
    launch.train(cfg, echo=lambda s: None)
    wall = time.perf_counter() - t0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    kept = [{k: v for k, v in r.items() if k in ("step", "time") or k.startswith(KEPT_PREFIXES)}
            for r in records if r.get("step", 0) > 0 and "time/step" in r]
    return RunRecord(name, list(SCHEDULES[name]), facts_of(cfg), wall, kept,
                     trained_samples(out, steps, prompt_len), [load_before, os.getloadavg()[0]], repeat)


def training_prompts(model: str, data: dict, out: Path) -> list:
    """The training prompts (``PromptRecord``) as a run renders and tokenises them."""
    from gyre.training.run_data import RunData

    return RunData.load(run_config(SETTINGS[0], model, data, out, 1, 0)).train


# ---- engine microbenchmark ----------------------------------------------------------------------------------
def engine_point(engine, vocab: int, rows: int, prompt: int, seed: int, sizes: Sizes = Sizes()) -> EnginePoint:
    """Prefill and decode-step seconds of ``rows`` distinct random prompts of ``prompt`` tokens each."""
    import torch

    from gyre.types import GenerationRequest, SamplingParams

    params = SamplingParams(max_new_tokens=1 << 20, ignore_eos=True)
    gen = torch.Generator().manual_seed(seed)
    firsts, steps, contexts = [], [], []
    for rep in range(sizes.prefill_repeats):
        reqs = [GenerationRequest(f"r{rep}-{i}", torch.randint(3, vocab, (prompt,), generator=gen).tolist(), params,
                                  seed=i) for i in range(rows)]
        engine.add(reqs)
        t0 = time.perf_counter()
        engine.step()  # admission prefill + the first sample + one decode forward
        firsts.append(time.perf_counter() - t0)
        for k in range(WARMUP_STEPS + (sizes.timed_steps if rep == 0 else 0)):
            t0 = time.perf_counter()
            engine.step()
            if k >= WARMUP_STEPS:
                steps.append(time.perf_counter() - t0)
                contexts.append(rows * (prompt + k + 2))  # cache after this step's forward
        engine.abort([r.request_id for r in reqs])
    decode = statistics.median(steps)
    return EnginePoint(rows, prompt, decode, statistics.pstdev(steps) / statistics.mean(steps) * 100,
                       statistics.mean(contexts), statistics.median(f - decode for f in firsts), rows * prompt)


def engine_sweep(model_path: str, threads: int, sizes: Sizes = Sizes()) -> list[EnginePoint]:
    """The HF rollout engine on its own (no Ray), at the thread count of one run worker."""
    import torch

    from gyre.engines.hf_rollout import HFRolloutEngine
    from gyre.models.loading import load_causal_lm, load_tokenizer

    torch.set_num_threads(threads)
    tokenizer = load_tokenizer(model_path)
    model = load_causal_lm(model_path)
    engine = HFRolloutEngine(model, tokenizer, "cpu")
    vocab = min(len(tokenizer), model.config.vocab_size)
    engine_point(engine, vocab, 8, 8, 0)  # warms the allocator and kernels
    points = []
    # Prompt lengths interleaved within each row count: a slow spell of the machine (or the allocator's
    # first growth) then skews neighbouring rows a little, not a whole prompt length's curve.
    for rows in sizes.decode_rows:
        for prompt in sizes.decode_prompts:
            points.append(engine_point(engine, vocab, rows, prompt, rows * 1000 + prompt, sizes))
            p = points[-1]
            print(f"  engine rows {rows:>3} prompt {prompt:>3}: decode {p.decode_step_s * 1e3:7.2f} ms "
                  f"(±{p.decode_step_std_pct:4.1f}%), prefill {p.prefill_s * 1e3:7.2f} ms", flush=True)
    return points


def engine_run_shape(model_path: str, prompts: list[list[int]], facts: dict, repeats: int = 6) -> list[ShapePoint]:
    """What one engine's generate costs outside a run, for the same shape as inside it: the gap between
    these seconds and a run's time/generate is what Ray, streaming and the run's other processes add."""
    from gyre.engines.hf_rollout import HFRolloutEngine
    from gyre.models.loading import load_causal_lm, load_tokenizer
    from gyre.types import GenerationRequest, SamplingParams

    engine = HFRolloutEngine(load_causal_lm(model_path), load_tokenizer(model_path), "cpu")
    per_engine = facts["prompts_per_step"] // len(facts["rollout_devices"])
    params = SamplingParams(max_new_tokens=facts["max_new_tokens"])
    points = []
    for rep in range(repeats):
        chosen = prompts[rep * per_engine:(rep + 1) * per_engine]
        engine.add([GenerationRequest(f"s{rep}-{i}", ids, params, n=facts["samples_per_prompt"], seed=rep * 1000 + i)
                    for i, ids in enumerate(chosen)])
        results, steps, t0 = [], 0, time.perf_counter()
        while engine.busy:
            results += engine.step()
            steps += 1
        seconds = time.perf_counter() - t0
        groups: dict[str, list] = {}
        for res in results:
            groups.setdefault(res.request_id, [len(res.prompt_ids), []])[1].append(len(res.response_ids))
        points.append(ShapePoint(seconds, steps, list(groups.values())))
    return points


def predict_generate(groups: list[list], coef: dict[str, dict[str, float]]) -> float:
    """One engine's generate seconds for ``groups`` ([prompt tokens, [response tokens]]) from the decode
    and prefill fits, counting only live rows (the engine keeps finished rows until a quarter of the
    batch has finished, so this is a lower bound)."""
    dec, pre = coef["decode_step_s"], coef["prefill_s"]
    lens = [(p, r) for p, rs in groups for r in rs]
    total = pre["overhead_s"] + pre["per_prefill_token_s"] * sum(p for p, _ in groups)
    for t in range(1, max((r for _, r in lens), default=0) + 1):
        live = [p + t for p, r in lens if r >= t]
        total += dec["overhead_s"] + dec["per_row_s"] * len(live) + dec["per_ctx_token_s"] * sum(live)
    return total


def generate_checks(runs: list[RunRecord], shapes: list[ShapePoint], fits: list[LinearFit]) -> dict:
    """Engine fits against the engine alone on the runs' shape, and against time/generate inside the
    synchronous hybrid runs (each engine taken to hold half the step's groups; the slower one counts)."""
    coef = {f.target: f.coef for f in fits}
    alone = [s.seconds / predict_generate(s.samples, coef) for s in shapes]
    in_run = []
    for run in runs:
        if run.facts["mode"] == "hybrid" and run.facts["tail_batching"] is None:
            for rec, groups in list(zip(run.steps, run.samples))[2:]:
                half = len(groups) // 2
                fit = max(predict_generate(groups[:half], coef), predict_generate(groups[half:], coef))
                in_run.append(rec["time/generate"] / fit)
    return {"engine_alone_over_fit": statistics.mean(alone) if alone else None,
            "in_run_generate_over_fit": statistics.mean(in_run) if in_run else None,
            "engine_alone_s": [s.seconds for s in shapes]}


def generate_fit(runs: list[RunRecord]) -> list[LinearFit]:
    """time/generate of the synchronous hybrid runs (sync, queue) against decode steps (the step's longest
    response) and decoded tokens per engine: the in-run cost, Ray and the other processes included."""
    xs, ys = [], []
    for run in runs:
        if run.facts["mode"] == "hybrid" and run.facts["tail_batching"] is None:
            for rec, groups in list(zip(run.steps, run.samples))[1:]:
                lens = [r for _, rs in groups for r in rs]
                xs.append([max(lens), sum(lens) / len(run.facts["rollout_devices"])])
                ys.append(rec["time/generate"])
    return [fit_linear("generate_s[sync hybrid] in run", ["per_decode_step_s", "per_decoded_token_s"], xs, ys)
            ] if len(ys) >= 3 else []


# ---- fits -----------------------------------------------------------------------------------------------------
def engine_fits(points: list[EnginePoint]) -> list[LinearFit]:
    """The brief's forms, plus prefill with a per-row term (each row's cache copy and first logits)."""
    return [fit_linear("decode_step_s", ["per_row_s", "per_ctx_token_s"],
                       [[p.rows, p.context_tokens] for p in points], [p.decode_step_s for p in points]),
            fit_linear("prefill_s", ["per_prefill_token_s"], [[p.prefill_tokens] for p in points],
                       [p.prefill_s for p in points]),
            fit_linear("prefill_s ~ rows + tokens", ["per_row_s", "per_prefill_token_s"],
                       [[p.rows, p.prefill_tokens] for p in points], [p.prefill_s for p in points])]


def step_tokens(run: RunRecord) -> list[dict]:
    """Per step: trained tokens (prompt + response) per policy rank, real and as padded rows cost them
    (every row padded to the batch's longest: one long sample lands in nearly every rank's micro-batch)."""
    ranks = len(run.facts["policy_devices"])
    out = []
    for rec, groups in zip(run.steps, run.samples):
        lens = [p + r for p, rs in groups for r in rs]
        if not lens:
            continue
        out.append({"step": rec["step"], "real": sum(lens) / ranks, "padded": len(lens) * max(lens) / ranks,
                    "train_s": rec.get("time/train"), "logprobs_s": rec.get("time/logprobs")})
    return out


def train_fits(runs: list[RunRecord]) -> list[LinearFit]:
    """time/train against tokens per policy rank over steps 2.. (step 1 warms up), pooled and per layout
    (hybrid: DDP over both slots; split: one policy slot), and time/logprobs pooled."""
    layouts = {"all": runs, "hybrid": [r for r in runs if r.facts["mode"] == "hybrid"],
               "split": [r for r in runs if r.facts["mode"] != "hybrid"]}
    fits = []
    for layout, chosen in layouts.items():
        rows = [t for run in chosen for t in step_tokens(run) if t["step"] >= 2 and t["train_s"]]
        for tokens in ("padded", "real"):
            if len(rows) >= 3:
                fits.append(fit_linear(f"train_s[{layout}] ~ {tokens} tok/rank", [f"per_{tokens}_token_s"],
                                       [[t[tokens]] for t in rows], [t["train_s"] for t in rows]))
    rows = [t for run in runs for t in step_tokens(run) if t["step"] >= 2 and t["logprobs_s"]]
    if len(rows) >= 3:
        fits.append(fit_linear("logprobs_s[all] ~ padded tok/rank", ["per_padded_token_s"],
                               [[t["padded"]] for t in rows], [t["logprobs_s"] for t in rows]))
    return fits


# ---- report -------------------------------------------------------------------------------------------------
def summarize(run: RunRecord) -> dict:
    """Means over steps 3..N (the first two pay for start-up; async fills its pipeline) and response lengths
    over every trained sample."""
    timed = run.steps[2:] or run.steps
    lens = [r for groups in run.samples for _, rs in groups for r in rs]

    def mean(key: str) -> float:
        return statistics.mean(r.get(key, 0.0) for r in timed)

    step_s = [r["time/step"] for r in timed]
    return {"setting": run.setting, "steps": len(run.steps), "wall_s": run.wall_s,
            "s_per_step": statistics.mean(step_s),
            "step_std_pct": statistics.pstdev(step_s) / statistics.mean(step_s) * 100,
            "generate_s": mean("time/generate"), "train_s": mean("time/train"), "logprobs_s": mean("time/logprobs"),
            "weight_sync_s": mean("time/weight_sync"), "response_mean": statistics.mean(lens) if lens else 0.0,
            "response_max": max(lens, default=0), "samples_trained": len(lens),
            "groups_expired": sum(r.get("rollout/groups_expired", 0) for r in run.steps),
            "tokens_wasted": sum(r.get("rollout/tokens_wasted", 0) for r in run.steps),
            "loadavg_after": run.loadavg[-1] if run.loadavg else None}


def paired_train_noise(runs: list[RunRecord]) -> float | None:
    """Timing noise of time/train, in percent: sync-hybrid and queue-hybrid train the very same samples
    at each step (same seed, per-sample sampler streams), so their difference is noise alone; the std of
    the paired relative difference over sqrt(2) is one run's noise. None without both runs."""
    by = {r.setting: r for r in runs}
    if "sync-hybrid" not in by or "queue-hybrid" not in by:
        return None
    diffs = [(a["time/train"] - b["time/train"]) / ((a["time/train"] + b["time/train"]) / 2) * 100
             for a, b in zip(by["sync-hybrid"].steps[1:], by["queue-hybrid"].steps[1:])]
    return statistics.pstdev(diffs) / 2 ** 0.5 if len(diffs) >= 2 else None


def print_summary(summaries: list[dict], fits: list[LinearFit]) -> None:
    print(f"\n{'setting':<14}{'wall s':>8}{'s/step':>8}{'std%':>6}{'generate':>10}{'train':>8}{'logprobs':>10}"
          f"{'w.sync':>8}{'resp mean':>10}{'resp max':>9}{'expired':>9}{'wasted tok':>11}{'load':>6}")
    for s in summaries:
        print(f"{s['setting']:<14}{s['wall_s']:>8.1f}{s['s_per_step']:>8.3f}{s['step_std_pct']:>6.1f}"
              f"{s['generate_s']:>10.3f}{s['train_s']:>8.3f}{s['logprobs_s']:>10.3f}{s['weight_sync_s']:>8.3f}"
              f"{s['response_mean']:>10.2f}{s['response_max']:>9d}{s['groups_expired']:>9d}{s['tokens_wasted']:>11d}"
              f"{s['loadavg_after'] if s['loadavg_after'] is not None else float('nan'):>6.1f}")
    print("\nfits (seconds):")
    for f in fits:
        coef = ", ".join(f"{k}={v:.4g}" for k, v in f.coef.items())
        print(f"  {f.target:<36} {coef}\n  {'':<36} n={f.points}, rms {f.residual_rms_s:.4g} s, "
              f"|resid| mean {f.residual_mean_abs_pct:.1f}% max {f.residual_max_abs_pct:.1f}%")


def measure(args: argparse.Namespace) -> dict:
    """Warm start, the real runs, the engine sweep; then ``analyse`` fits, writes the JSON and prints."""
    from gyre.app.preflight import preflight

    t_all, sizes = time.perf_counter(), args.sizes
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(args.out or tmp_dir)
        tmp.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        model, data = warm_start(tmp, sizes.sft_steps)
        warm_s = time.perf_counter() - t0
        print(f"warm start: {warm_s:.1f} s", flush=True)
        for name in SETTINGS:
            if args.smoke and name not in args.only:  # planned (config, placement), not trained
                preflight(run_config(name, model, data, tmp / "plan", args.steps, args.seed), None)
        prompts = training_prompts(model, data, tmp / "prompts")
        by_text = {p.prompt_text: len(p.prompt_ids) for p in prompts}
        runs = []
        for rep in range(args.repeats):  # settings interleaved within a pass: the machine's drift hits them alike
            for name in args.only:
                runs.append(run_setting(name, model, data, tmp / f"{name}-r{rep}", args.steps, args.seed + rep,
                                        by_text, rep))
                print(f"  {name:<13} pass {rep}: {runs[-1].wall_s:.1f} s for {args.steps} steps", flush=True)
        threads = runs[0].facts["threads_per_worker"] if runs else 1
        t0 = time.perf_counter()
        points = engine_sweep(model, threads, sizes)
        train_points = train_microbench(model, threads, sizes.train_repeats, sizes.train_shapes)
        trained = tmp / "sync-hybrid-r0" / "final_model"
        shapes = engine_run_shape(str(trained), [p.prompt_ids for p in prompts], runs[0].facts,
                                  sizes.shape_repeats) if trained.exists() else []
        raw = {"machine": machine(), "threads_per_worker": threads, "warm_start_s": warm_s,
               "engine_sweep_s": time.perf_counter() - t0, "total_s": time.perf_counter() - t_all,
               "common_overrides": COMMON, "model_config": json.loads((Path(model) / "config.json").read_text()),
               "train_prompt_tokens": {"mean": statistics.mean(len(p.prompt_ids) for p in prompts),
                                       "all": [len(p.prompt_ids) for p in prompts]},
               "engine_points": [asdict(p) for p in points], "train_points": train_points,
               "engine_run_shape": [asdict(p) for p in shapes],
               "runs": [asdict(r) for r in runs]}
    analyse(raw, Path(args.json))
    return raw


def analyse(raw: dict, path: Path) -> None:
    """Add the summaries, fits, per-step token counts and timing noise to ``raw``; write it to ``path`` and
    print the table (``report`` re-runs this on a stored JSON, e.g. after changing a fit)."""
    runs = [RunRecord(**{"loadavg": [], **r}) for r in raw["runs"]]
    points = [EnginePoint(**p) for p in raw["engine_points"]]
    shapes = [ShapePoint(**p) for p in raw.get("engine_run_shape", [])]
    fits = engine_fits(points) + generate_fit(runs) + train_fits(runs)
    summaries = [summarize(r) for r in runs]
    noise = paired_train_noise(runs)
    checks = generate_checks(runs, shapes, fits)
    result = {**raw, "summaries": summaries, "fits": [asdict(f) for f in fits], "train_noise_pct": noise,
              "generate_checks": checks, "train_tokens": {r.setting: step_tokens(r) for r in runs}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, separators=(",", ":")))
    print_summary(summaries, fits)
    alone, in_run = (checks[k] or float("nan") for k in ("engine_alone_over_fit", "in_run_generate_over_fit"))
    print(f"\nengine alone on a run's shape / engine fits: {alone:.2f}x; "
          f"in-run time/generate (sync, queue) / engine fits: {in_run:.2f}x")
    if noise is not None:
        print(f"\ntime/train noise (sync vs queue, same samples each step): {noise:.1f}% per run")
    print(f"\nwrote {path} ({path.stat().st_size / 1024:.0f} KiB); measuring took {raw['total_s']:.0f} s "
          f"(warm start {raw['warm_start_s']:.0f} s, engine sweep {raw['engine_sweep_s']:.0f} s)")


def predict(raw: dict, md: Path | None, seeds: tuple[int, ...] = SIM_SEEDS, passes: int | None = None) -> None:
    """Per pass: fit the CPU class from that pass's sync-hybrid run, simulate every run of the pass from its
    own config (plus simulate.* keys) over workload ``seeds``, print the comparison and write it to ``md``
    (None: print only) (``bench/sim_predict.py``). ``passes``: the first this many (None: all)."""
    from sim_predict import comparison_rows, fit_record, fit_summary, table

    from gyre.config.catalog import ModelShape

    engine = next(f for f in engine_fits([EnginePoint(**p) for p in raw["engine_points"]])
                  if f.target == "decode_step_s").coef
    if "model_config" not in raw:
        raise SystemExit("this JSON predates predict (no model_config): measure again")
    prompts = raw["train_prompt_tokens"]["all"]
    out, fits = [f"# Simulator calibration on this machine's CPU ({raw['machine']['cpus']} cores)\n"], []
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        model_dir = tmp / "model"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(raw["model_config"]))
        model = ModelShape.from_hf_config(model_dir)
        for rep in sorted({r.get("repeat", 0) for r in raw["runs"]})[:passes]:
            runs = [r for r in raw["runs"] if r.get("repeat", 0) == rep]
            sync = next(r for r in runs if r["setting"] == "sync-hybrid")
            fit = fit_cpu(sync, engine, model, prompts, raw.get("train_points"))
            calibrate = tmp / f"metrics-r{rep}.jsonl"
            calibrate.write_text("".join(json.dumps(r) + "\n" for r in sync["steps"]))

            def config_of(run: dict):
                sim = ["simulate.model=config", "simulate.device=cpu", "simulate.devices=2",
                       f"simulate.steps={len(run['steps'])}", "simulate.warmup_steps=2"]
                return run_config(run["setting"], str(model_dir), {"train": "unused", "val": "unused"}, tmp / "cfg",
                                  len(run["steps"]), run["facts"]["seed"], tuple(sim))

            rows = comparison_rows(runs, fit, config_of, calibrate, None, seeds)
            empirical = comparison_rows(runs, fit, config_of, calibrate, sync["samples"], seeds)
            own = [row for run in runs for row in comparison_rows([run], fit, config_of, calibrate, run["samples"],
                                                                  seeds)]
            fits.append({"repeat": rep, "fit": fit_record(fit), "rows": rows, "empirical_rows": empirical,
                         "own_length_rows": own})
            out += [f"## Pass {rep}\n", "```", fit_summary(fit), "```\n",
                    "Lengths from `fit_lengths` (the lognormal of `--calibrate metrics.jsonl`):\n", table(rows), "",
                    "Lengths drawn from the sync run's recorded groups (`gyre.sim.workload.RecordedWorkload`):\n",
                    table(empirical), "", "A diagnostic, not a prediction: the same class, each run's lengths drawn "
                    "from its *own* trained groups (what the cost model and scheduler give when the lengths are "
                    "right):\n", table(own), ""]
    text = "\n".join(out)
    print(text)
    if md is None:
        return
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(text + "\n")
    md.with_name(md.stem + "_fits.json").write_text(json.dumps(fits, indent=1))
    print(f"\nwrote {md}")


# ---- both: calibrate from the sync run's directory, predict every setting with gyre simulate's path ----------
BOTH_SETTINGS = ("sync-hybrid", "async-2", "lockstep-2")
"""The synchronous setting the simulator is calibrated from, and two it predicts: window and lockstep asynchrony."""
TARGET_PCT = 25.0
"""A prediction is within target when its seconds per step are within this share of the measured."""
BOTH_SMOKE = {"steps": 4, "repeats": 1, "seed": 0, "only": ["sync-hybrid"], "out": None, "sft_steps": 0,
              "seeds": SIM_SEEDS[:1]}
"""--smoke: the sync run alone (4 steps: 3 past the first, which every fit leaves out), no SFT warm start, one
workload seed; the other settings are planned (config and placement checked), not trained."""


def sim_keys(steps: int, seed: int) -> list[str]:
    """The simulate section of a prediction: this CPU's class (replaced by the fitted one), the run's own
    model, its 2 slots, the run's steps with the first two left out as the measured means leave them out."""
    return ["simulate.model=config", "simulate.device=cpu", "simulate.devices=2", f"simulate.steps={steps}",
            "simulate.warmup_steps=2", f"simulate.seed={seed}"]


def measured_steps(run_dir: Path) -> dict:
    """Means over steps 3..N of a real run: s/step (and its std over steps), generate, and the trainer side
    (step - generate - weight sync)."""
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    timed = [r for r in steps if "time/step" in r][2:]
    step = [r["time/step"] for r in timed]
    return {"step_s": statistics.mean(step), "step_std": statistics.pstdev(step), "steps": len(timed) + 2,
            "generate_s": statistics.mean(r["time/generate"] for r in timed),
            "train_s": statistics.mean(r["time/step"] - r["time/generate"] - r.get("time/weight_sync", 0.0)
                                       for r in timed)}


def predict_run(run_dir: Path, calibrate: Path, seeds: tuple[int, ...], own: bool = False) -> dict:
    """``gyre simulate``'s path on the run's resolved config: ``scenario(cfg, 2, calibrate)`` simulated per
    workload seed, means of s/step, generate and train over the measured steps; ``own``: the run's own trained
    groups replayed instead of the calibration run's (a diagnostic: the lengths right, the device fitted)."""
    from gyre.config import load_config
    from gyre.sim.calibrate import RunRecords, replayed_groups
    from gyre.sim.run import simulate
    from gyre.sim.scenario import scenario

    steps = measured_steps(run_dir)["steps"]
    groups = replayed_groups(RunRecords.read(run_dir)) if own else None
    out: dict[str, list] = {"step_s": [], "generate_s": [], "train_s": []}
    for seed in seeds:
        spec = scenario(load_config(run_dir / "resolved_config.yaml", sim_keys(steps, seed)), 2, calibrate)
        res = simulate(replace(spec, recorded=groups) if own else spec)
        out["step_s"].append(res.step_s)
        out["generate_s"].append(res.mean("generate_s"))
        out["train_s"].append(res.mean("train_s"))
    return {k: statistics.mean(v) for k, v in out.items()} | {"layout": spec.layout.describe()}


def verdict(error_pct: float) -> str:
    miss = abs(error_pct) - TARGET_PCT
    return "within" if miss <= 0 else f"misses by {miss:.1f} pts"


def both_table(rows: list[dict]) -> str:
    lines = [f"| setting | pass | layout (sim) | measured s/step (± std over steps) | predicted | error | "
             f"target {TARGET_PCT:g}% | generate meas / pred | trainer side meas / pred | own lengths (diagnostic) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m, p, o = r["measured"], r["predicted"], r["own"]
        lines.append(f"| {r['setting']} | {r['repeat']} | {p['layout']} | {m['step_s']:.3f} ± {m['step_std']:.3f} | "
                     f"{p['step_s']:.3f} | {r['error_pct']:+.1f}% | {verdict(r['error_pct'])} | "
                     f"{m['generate_s']:.3f} / {p['generate_s']:.3f} | {m['train_s']:.3f} / {p['train_s']:.3f} | "
                     f"{o['step_s']:.3f} ({(o['step_s'] - m['step_s']) / m['step_s'] * 100:+.1f}%) |")
    return "\n".join(lines)


def both(args: argparse.Namespace) -> list[dict]:
    """Train ``args.only`` (sync-hybrid, the calibration run, first) per pass, calibrate from the sync run's
    directory, predict every run of the pass, print (and with ``args.md`` write) the comparison."""
    from gyre.app.launch import train
    from gyre.app.preflight import preflight
    from gyre.config import load_config
    from gyre.sim.scenario import calibration

    settings = ["sync-hybrid", *(n for n in args.only if n != "sync-hybrid")]
    rows, reports, t_all = [], [], time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(args.out or tmp_dir)
        tmp.mkdir(parents=True, exist_ok=True)
        model, data = warm_start(tmp, args.sft_steps)
        for name in BOTH_SETTINGS if args.smoke else ():  # planned (config, placement), not trained
            if name not in settings:
                preflight(run_config(name, model, data, tmp / "plan", args.steps, args.seed), None)
        for rep in range(args.repeats):
            dirs = {}
            for name in settings:  # interleaved within a pass: the machine's drift hits the settings alike
                dirs[name] = tmp / f"{name}-r{rep}"
                t0 = time.perf_counter()
                train(run_config(name, model, data, dirs[name], args.steps, args.seed + rep), echo=lambda s: None)
                print(f"  {name:<13} pass {rep}: {time.perf_counter() - t0:.1f} s for {args.steps} steps", flush=True)
            sync = dirs["sync-hybrid"]
            cfg = load_config(sync / "resolved_config.yaml", sim_keys(args.steps, 0))
            reports.append(calibration(cfg, sync).report())  # what every prediction of the pass is fitted to
            print(reports[-1], flush=True)
            for name, run_dir in dirs.items():
                m, p = measured_steps(run_dir), predict_run(run_dir, sync, args.seeds)
                rows.append({"setting": name, "repeat": rep, "measured": m, "predicted": p,
                             "own": predict_run(run_dir, sync, args.seeds, own=True),
                             "error_pct": (p["step_s"] - m["step_s"]) / m["step_s"] * 100})
    head = (f"`python bench/sim_calibration.py both --steps {args.steps} --repeats {args.repeats}` "
            f"({time.perf_counter() - t_all:.0f} s; {machine()['cpus']} cores)")
    text = "\n\n".join([head, *reports, both_table(rows)])
    print("\n" + text)
    if args.md:
        Path(args.md).parent.mkdir(parents=True, exist_ok=True)
        Path(args.md).write_text(text + "\n")
        print(f"\nwrote {args.md}")
    return rows


def machine() -> dict:
    import platform

    import torch

    return {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "python": platform.python_version()}


def smoke() -> None:
    """`both` at its smallest (BOTH_SMOKE), in a temporary directory: nothing written to bench/results."""
    both(argparse.Namespace(**BOTH_SMOKE, smoke=True, md=None))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="`both` at its smallest (BOTH_SMOKE), in a temp directory")
    sub = ap.add_subparsers(dest="command")
    m = sub.add_parser("measure", help="real runs + engine microbenchmarks + fits -> JSON")
    m.add_argument("--steps", type=int, default=12)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--only", nargs="+", choices=list(SCHEDULES), default=list(SETTINGS))
    m.add_argument("--out", default=None, help="keep the warm start and run dirs here (default: a temp dir)")
    m.add_argument("--json", default=str(DEFAULT_JSON))
    r = sub.add_parser("report", help="recompute the fits and table of a stored JSON (rewritten in place)")
    r.add_argument("--json", default=str(DEFAULT_JSON))
    p = sub.add_parser("predict", help="fit the CPU class from the sync-hybrid run of a stored JSON, simulate "
                                       "every run's setting, compare")
    p.add_argument("--json", default=str(DEFAULT_JSON))
    p.add_argument("--md", default=str(DEFAULT_MD))
    b = sub.add_parser("both", help="train sync-hybrid and two other settings, calibrate from the sync run's "
                                    "directory, predict all with gyre simulate's path, compare")
    for sp in (m, b):
        sp.add_argument("--repeats", type=int, default=1, help="passes over the settings (interleaved)")
    b.add_argument("--steps", type=int, default=12)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--only", nargs="+", choices=list(SCHEDULES), default=list(BOTH_SETTINGS),
                   help="settings to train and predict (sync-hybrid, the calibration run, always trains)")
    b.add_argument("--out", default=None, help="keep the warm start and run dirs here (default: a temp dir)")
    b.add_argument("--md", default=None, help="also write the comparison here")
    args = ap.parse_args()
    if args.smoke:
        return smoke()
    if args.command is None:
        ap.error("choose a command (measure, report, predict, both) or --smoke")
    args.sizes = Sizes()
    if args.command == "measure":
        measure(args)
    elif args.command == "report":
        analyse(json.loads(Path(args.json).read_text()), Path(args.json))
    elif args.command == "predict":
        predict(json.loads(Path(args.json).read_text()), Path(args.md))
    else:
        both(argparse.Namespace(**vars(args), sft_steps=args.sizes.sft_steps, seeds=SIM_SEEDS))


if __name__ == "__main__":
    main()
