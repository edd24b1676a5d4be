"""A fixed rollout pool against an elastic one of the same mean size, side by side on the same cores.

fixed: two rollout engines for the whole run. elastic: one base engine, and two lent engines that
are lent for ``--period`` steps and taken back for the next ``--period`` (``rollout.elastic`` schedule,
notice 0: a reclaimed engine hands back its unfinished samples at once, other engines continue them), so
the pool is asked for 3 and 1 engines in turn: 2 on average by steps. Lent engines join when they have
started and taken the weights (the run trains on meanwhile, ``wait_for_joins`` off, as in production), so
the pool's measured mean is below 2 by the time joins take. Both train the same long-tailed task
(``gyre.tasks.repeat``, one prompt in twelve asks for 150-250 characters; queue scheduling) from one warm
start with the same seeds.

What the table gives: response tokens trained per second, the pool's measured mean size (engine-seconds
over the timed steps' wall time: lent engines that are still starting do not count, and the steps that
wait for them do), tokens trained per engine-second, the elastic pool's joins, leaves, tokens handed back
and samples regenerated, the share of generated tokens wasted, and whether the trained-sample ledger
accounts for every prompt drawn (none lost or trained twice).

``--smoke``: the same path at its smallest (2-step warm start, 4 steps a run, a 2-step period).

    python bench/elastic_pool.py [--steps 24] [--period 6] [--seeds 0] [--out DIR] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

PROMPTS, SAMPLES = 16, 8
COMMON = ["cluster.cpu_slots=3", f"rollout.prompts_per_step={PROMPTS}", f"rollout.samples_per_prompt={SAMPLES}",
          "rollout.schedule=queue", "rollout.sampling.max_new_tokens=256", "policy.devices=[0]",
          "policy.micro_batch_size=128", "policy.optimizer.lr=5e-4", "reward.type=function",
          "reward.function=gyre.tasks.repeat:repeat_reward", "validation.every=0", "logging.progress=false",
          "logging.trackers=[]", "logging.plot=false", "checkpoint.every=0"]
SMOKE = {"steps": 4, "period": 2, "seeds": [0], "sft_steps": 2}


def pools(steps: int, period: int) -> dict[str, list[str]]:
    """Each pool's config keys: fixed 2 engines, or 1 base + 2 lent for ``period`` steps in every 2 x period."""
    schedule = ", ".join(f"{{step: {s}, engines: {3 if (s - 1) // period % 2 == 0 else 1}}}"
                         for s in range(1, steps + 1, period))
    return {"fixed": ["rollout.devices=[1,2]"],
            "elastic": ["rollout.devices=[1]", f"rollout.elastic={{max_engines: 3, notice_s: 0, "
                                                f"schedule: [{schedule}]}}"]}


def warm_start(tmp: Path, sft_steps: int) -> tuple[str, dict]:
    from gyre.app.ablation import warm_start as shared_warm_start
    from gyre.config import load_config
    from gyre.models.presets import init_model
    from gyre.tasks.repeat import RepeatSpec, write_repeat_task

    data = write_repeat_task(tmp / "data", RepeatSpec(short=(1, 6), long=(150, 250), long_frac=0.08))
    model = init_model("tiny", tmp / "model")
    base = load_config(None, [f"model.path={model}", f"data.train_files=[{data['train']}]",
                              f"sft_warmup.train_files=[{data['sft']}]", f"sft_warmup.steps={sft_steps}",
                              "sft_warmup.batch_size=64", "sft_warmup.micro_batch_size=64",
                              "sft_warmup.optimizer.lr=3e-3", *COMMON, "rollout.devices=[1]"])
    return shared_warm_start(base, tmp / "warm", lambda s: None), data


def run(name: str, keys: list[str], model: str, data: dict, out: Path, steps: int, seed: int) -> dict:
    from gyre.app import launch
    from gyre.config import load_config
    from gyre.rollout.ledger import audit

    cfg = load_config(None, [f"run.output_dir={out}", f"run.steps={steps}", f"run.seed={seed}", f"model.path={model}",
                             f"data.train_files=[{data['train']}]", *COMMON, *keys])
    t0 = time.perf_counter()
    launch.train(cfg, echo=lambda s: None)
    wall = time.perf_counter() - t0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r.get("step", 0) > 0 and "time/step" in r]
    timed = train[1:]  # the first step pays for start-up
    span = timed[-1]["time"] - timed[0]["time"] + timed[0]["time/step"]
    tokens = sum(r["batch/response_tokens"] for r in timed)
    if "rollout/engine_seconds" in timed[-1]:
        engine_s = timed[-1]["rollout/engine_seconds"] - train[0]["rollout/engine_seconds"]
    else:
        engine_s = len(cfg.rollout.devices) * span
    generated = sum(r.get("rollout/tokens_generated", 0) for r in train)
    ledger = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    last = train[-1]
    return {"pool": name, "seed": seed, "tokens_per_s": tokens / span, "mean_engines": engine_s / span,
            "tokens_per_engine_s": tokens / engine_s, "s_per_step": statistics.mean(r["time/step"] for r in timed),
            "joins": last.get("elastic/joins", 0), "leaves": last.get("elastic/leaves", 0),
            "handed_back": last.get("elastic/tokens_handed_back", 0),
            "continued": sum(r.get("rollout/samples_continued", 0) for r in train),
            "regenerated": last.get("elastic/samples_orphaned", 0),
            "wasted_share": sum(r.get("rollout/tokens_wasted", 0) for r in train) / generated if generated else 0.0,
            "ledger_problems": len(audit(ledger)), "wall_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--period", type=int, default=6, help="steps the lent engines stay, and stay away")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--sft-steps", type=int, default=40)
    ap.add_argument("--out", default=None, help="keep the runs and results.json here")
    ap.add_argument("--smoke", action="store_true", help="the smallest run of the same path (SMOKE)")
    args = ap.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(args.out or tmp_dir)
        tmp.mkdir(parents=True, exist_ok=True)
        model, data = warm_start(tmp, args.sft_steps)
        results = []
        for seed in args.seeds:  # pools interleaved within a seed: machine drift hits them alike
            for name, keys in pools(args.steps, args.period).items():
                results.append(run(name, keys, model, data, tmp / f"{name}-seed{seed}", args.steps, seed))
                r = results[-1]
                print(f"  {name:<8} seed {seed}: {r['tokens_per_s']:.0f} tokens/s over {r['mean_engines']:.2f} "
                      f"engines on average", flush=True)
        (tmp / "results.json").write_text(json.dumps(results, indent=1))
        report(results)


def report(results: list[dict]) -> None:
    by: dict[str, list[dict]] = {}
    for r in results:
        by.setdefault(r["pool"], []).append(r)
    avg = lambda runs, key: statistics.mean(r[key] for r in runs)  # noqa: E731
    base = avg(by["fixed"], "tokens_per_s")
    print(f"\n{'pool':<9}{'tokens/s':>10}{'vs fixed':>10}{'mean engines':>14}{'tokens/engine-s':>17}{'s/step':>8}"
          f"{'joins':>7}{'leaves':>8}{'handed back':>13}{'continued':>11}{'regenerated':>13}{'wasted':>8}{'ledger':>8}")
    for name, runs in by.items():
        ledger = "ok" if not any(r["ledger_problems"] for r in runs) else "FAILS"
        print(f"{name:<9}{avg(runs, 'tokens_per_s'):>10.0f}{avg(runs, 'tokens_per_s') / base:>9.2f}x"
              f"{avg(runs, 'mean_engines'):>14.2f}{avg(runs, 'tokens_per_engine_s'):>17.1f}"
              f"{avg(runs, 's_per_step'):>8.2f}"
              f"{avg(runs, 'joins'):>7.0f}{avg(runs, 'leaves'):>8.0f}{avg(runs, 'handed_back'):>13.0f}"
              f"{avg(runs, 'continued'):>11.0f}{avg(runs, 'regenerated'):>13.0f}{avg(runs, 'wasted_share'):>8.0%}"
              f"{ledger:>8}")
    if any(r["ledger_problems"] for r in results):
        raise SystemExit("a run's ledger does not account for every prompt")


if __name__ == "__main__":
    main()
