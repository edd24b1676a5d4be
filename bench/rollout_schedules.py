"""Rollout schedules side by side on a long-tailed task: synchronous layouts, queue scheduling, tail
batching and asynchronous training (alpha 1 and 2, in window and lockstep mode), on the same cores, from
one warm start, compared by what a user buys: response tokens trained per second.

The task (``gyre.tasks.repeat``) asks for a character repeated k times: most answers are 1-6 characters,
one prompt in twelve asks for 40-60, so a synchronous step waits on its few longest samples. ``--tail long``
asks 150-250 of that twelfth (256 new tokens at most), ``--tail xlong`` 400-500 (512): the longer the tail,
the more a synchronous step waits on decoding, the regime asynchrony is built for. Each schedule
trains for the same number of steps and seeds; the table gives response tokens trained per second and
samples per second (validation time excluded), the tokens' ratio to the best synchronous layout, the share
of generated tokens wasted (aborted, expired, regenerated), held-out reward at the end, and whether the
run's ledger accounts for every prompt drawn. Samples/s alone flatters a schedule that trains the short
answers and wastes the long ones. Below the table: the overlap ceiling, the best synchronous layout's
generate + train time over the larger of the two (what perfect overlap of the two could give). A JSON
file holds every run's curve (held-out reward against samples consumed).

``--smoke``: the smallest run of the same path: a 2-step warm start, 3 steps of async-2 (alpha 2, window)
with one validation; the other schedules are planned (config and placement checked), not trained.

    python bench/rollout_schedules.py [--steps 40] [--seeds 0 1] [--only sync-hybrid async-2] [--tail short|long]
                                      [--out DIR] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

PROMPTS, SAMPLES = 32, 8
TAILS = {"short": ((40, 60), 64), "long": ((150, 250), 256), "xlong": ((400, 500), 512)}
"""--tail: the long answers' lengths, and the most new tokens a sample may have."""
COMMON = ["cluster.cpu_slots=2", f"rollout.prompts_per_step={PROMPTS}", f"rollout.samples_per_prompt={SAMPLES}",
          "policy.micro_batch_size=128", "policy.optimizer.lr=5e-4",
          "reward.type=function", "reward.function=gyre.tasks.repeat:repeat_reward", "data.max_val_prompts=64",
          "logging.progress=false", "logging.trackers=[]", "logging.plot=false", "checkpoint.every=0"]
HYBRID = ["rollout.mode=hybrid", "rollout.devices=[0,1]", "policy.devices=[0,1]"]
SPLIT = ["rollout.devices=[0]", "policy.devices=[1]"]
SCHEDULES: dict[str, list[str]] = {
    "sync-hybrid": HYBRID,
    "sync-split": SPLIT,
    "queue-hybrid": [*HYBRID, "rollout.schedule=queue"],
    "tail-hybrid": [*HYBRID, "rollout.tail_batching={}"],
    "async-1": [*SPLIT, "rollout.async_ratio=1"],
    "async-2": [*SPLIT, "rollout.async_ratio=2"],
    "lockstep-1": [*SPLIT, "rollout.async_ratio=1", "rollout.async_mode=lockstep"],
    "lockstep-2": [*SPLIT, "rollout.async_ratio=2", "rollout.async_mode=lockstep"],
}
SYNC = ("sync-hybrid", "sync-split")
SMOKE = {"steps": 3, "seeds": [0], "every": 2, "only": ["async-2"], "sft_steps": 2}
"""--smoke: every run starts its own workers (20-40 s on 2 cores), so one schedule trains: an asynchronous
one, with the most machinery (rollout ahead of the policy on its own slot, a staleness window)."""


def warm_start(tmp: Path, sft_steps: int = 40, tail: str = "short") -> tuple[str, dict]:
    """A tiny model taught the task's format by a short SFT, shared by every run (``sft_steps`` 0: untaught)."""
    from gyre.app.ablation import warm_start as shared_warm_start
    from gyre.config import load_config
    from gyre.models.presets import init_model
    from gyre.tasks.repeat import RepeatSpec, write_repeat_task

    data = write_repeat_task(tmp / "data", RepeatSpec(short=(1, 6), long=TAILS[tail][0], long_frac=0.08))
    model = init_model("tiny", tmp / "model")
    if not sft_steps:
        return str(model), data
    base = load_config(None, [f"model.path={model}", f"data.train_files=[{data['train']}]",
                              f"sft_warmup.train_files=[{data['sft']}]", f"sft_warmup.steps={sft_steps}",
                              "sft_warmup.batch_size=64", "sft_warmup.micro_batch_size=64",
                              "sft_warmup.optimizer.lr=3e-3", *COMMON, *HYBRID, *shared_keys(tail)])
    return shared_warm_start(base, tmp / "warm", lambda s: None), data


EXTRA: list[str] = []
"""--set: config overrides added to every schedule (e.g. policy.remove_padding=pack)."""


def shared_keys(tail: str) -> list[str]:
    """What the warm start and every schedule share: the tail's new-token limit and the --set overrides."""
    return [f"rollout.sampling.max_new_tokens={TAILS[tail][1]}", *EXTRA]


def schedule_config(name: str, model: str, data: dict, out: Path, steps: int, seed: int, every: int,
                    tail: str = "short"):
    from gyre.config import load_config

    return load_config(None, [f"run.output_dir={out}", f"run.steps={steps}", f"run.seed={seed}",
                              f"model.path={model}", f"data.train_files=[{data['train']}]",
                              f"data.val_files=[{data['val']}]", f"validation.every={every}", *COMMON,
                              *shared_keys(tail), *SCHEDULES[name]])


def run(name: str, model: str, data: dict, out: Path, steps: int, seed: int, every: int, tail: str) -> dict:
    from gyre.app import launch
    from gyre.rollout.ledger import audit

    t0 = time.perf_counter()
    launch.train(schedule_config(name, model, data, out, steps, seed, every, tail), echo=lambda s: None)
    wall = time.perf_counter() - t0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r.get("step", 0) > 0 and "time/step" in r]
    timed = train[2:]  # the first steps pay for start-up (and async fills its pipeline)
    span = timed[-1]["time"] - timed[0]["time"] + timed[0]["time/step"]
    val_s = sum(r.get("time/validate", 0.0) for r in timed)
    samples = PROMPTS * SAMPLES * len(timed)
    tokens = sum(r["batch/response_tokens"] for r in timed)
    generated = sum(r.get("rollout/tokens_generated", 0) for r in train)
    ledger = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    curve, consumed = [], 0
    for r in records:
        consumed += PROMPTS * SAMPLES if "time/step" in r else 0
        if "val/reward/mean" in r:
            curve.append((consumed, r["val/reward/mean"]))
    return {"schedule": name, "seed": seed, "samples_per_s": samples / (span - val_s),
            "tokens_per_s": tokens / (span - val_s), "ledger_problems": len(audit(ledger)),
            "wasted_share": sum(r.get("rollout/tokens_wasted", 0) for r in train) / generated if generated else 0.0,
            "s_per_step": statistics.mean(r["time/step"] for r in timed), "wall_s": wall, "curve": curve,
            "staleness_mean": statistics.mean(r.get("staleness/mean", 0.0) for r in train),
            "generate_s": statistics.mean(r["time/generate"] for r in timed),
            "train_s": statistics.mean(r["time/train"] for r in timed),
            "groups_expired": sum(r.get("rollout/groups_expired", 0) for r in train),
            "tokens_wasted": sum(r.get("rollout/tokens_wasted", 0) for r in train),
            "response_length_max": statistics.mean(r["response_length/max"] for r in train)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--every", type=int, default=10, help="validate every this many steps")
    ap.add_argument("--only", nargs="+", choices=list(SCHEDULES), default=list(SCHEDULES))
    ap.add_argument("--out", default=None, help="keep the runs and results.json here")
    ap.add_argument("--sft-steps", type=int, default=40, help="steps of the shared SFT warm start")
    ap.add_argument("--tail", choices=list(TAILS), default="short", help="the long answers' lengths (TAILS)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides for every run")
    ap.add_argument("--smoke", action="store_true", help="the smallest run of the same path (SMOKE)")
    args = ap.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    EXTRA[:] = args.set
    from gyre.app.preflight import preflight

    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(args.out or tmp_dir)
        tmp.mkdir(parents=True, exist_ok=True)
        model, data = warm_start(tmp, args.sft_steps, args.tail)
        for name in SCHEDULES:
            if args.smoke and name not in args.only:  # planned (config, placement), not trained
                preflight(schedule_config(name, model, data, tmp / "plan", args.steps, 0, args.every, args.tail), None)
        results = []
        for seed in args.seeds:  # schedules interleaved within a seed: machine drift hits them alike
            for name in args.only:
                results.append(run(name, model, data, tmp / f"{name}-seed{seed}", args.steps, seed, args.every,
                                   args.tail))
                r = results[-1]
                print(f"  {name:<13} seed {seed}: {r['tokens_per_s']:.0f} tokens/s, "
                      f"{r['samples_per_s']:.1f} samples/s, {r['s_per_step']:.2f} s/step, "
                      f"held-out reward {r['curve'][-1][1] if r['curve'] else float('nan'):.3f}", flush=True)
        (tmp / "results.json").write_text(json.dumps(results, indent=1))
        report(results)


def report(results: list[dict]) -> None:
    by = {}
    for r in results:
        by.setdefault(r["schedule"], []).append(r)
    avg = lambda runs, key: statistics.mean(r.get(key, 0) for r in runs)  # noqa: E731
    tokens = {k: avg(v, "tokens_per_s") for k, v in by.items()}
    best_sync = max((k for k in SYNC if k in tokens), key=tokens.get, default=None)
    print(f"\n{'schedule':<14}{'tokens/s':>10}{'vs best sync':>14}{'samples/s':>11}{'wasted':>8}{'held-out':>10}"
          f"{'staleness':>11}{'s/step':>8}{'generate s':>12}{'train s':>9}{'ledger':>8}")
    for name, runs in by.items():
        ratio = f"{tokens[name] / tokens[best_sync]:.2f}x" if best_sync else "-"
        final = statistics.mean(r["curve"][-1][1] for r in runs if r["curve"]) if any(r["curve"] for r in runs) else 0
        ledger = "ok" if not any(r.get("ledger_problems") for r in runs) else "FAILS"
        print(f"{name:<14}{tokens[name]:>10.0f}{ratio:>14}{avg(runs, 'samples_per_s'):>11.1f}"
              f"{avg(runs, 'wasted_share'):>8.0%}{final:>10.3f}{avg(runs, 'staleness_mean'):>11.2f}"
              f"{avg(runs, 's_per_step'):>8.2f}{avg(runs, 'generate_s'):>12.2f}{avg(runs, 'train_s'):>9.2f}{ledger:>8}")
    if best_sync is not None:
        gen, train = avg(by[best_sync], "generate_s"), avg(by[best_sync], "train_s")
        if max(gen, train) > 0:
            print(f"overlap ceiling: {(gen + train) / max(gen, train):.2f}x ({best_sync}: generate {gen:.2f} s + train "
                  f"{train:.2f} s a step, over the larger: what overlapping them perfectly could give)")
        if "sync-split" in by and max(avg(by["sync-split"], "generate_s"), avg(by["sync-split"], "train_s")) > 0:
            # The asynchronous schedules run disaggregated: the engine and the trainer get half the
            # devices each, so each side is as slow as in sync-split, and overlap hides only the smaller.
            split = max(avg(by["sync-split"], "generate_s"), avg(by["sync-split"], "train_s"))
            print(f"split-layout ceiling: {(gen + train) / split:.2f}x ({best_sync}'s step over the larger of "
                  "sync-split's generate and train: what an asynchronous run on half the devices each could give)")


if __name__ == "__main__":
    main()
