"""Where a gyre RL step spends its time, per phase, for a few placements of the roles on 2 CPU slots.

Batch: 8 prompts x 8 samples x up to 32 new tokens (the TRL comparison's batch), fp32, tiny models
built locally. Prints mean seconds per phase after warm-up steps, and generated tokens per second.
``--smoke``: the smallest run of the same path (tiny model, 2 steps, one layout trained, every other
layout's config checked without training).

    python bench/step_breakdown.py [--preset small] [--steps 12] [--warmup 3] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

PHASES = ("generate", "reward", "logprobs", "train", "weight_sync")
LAYOUTS = {
    "colocated, 1 worker x 2 threads": ["cluster.cpu_slots=1", "cluster.threads_per_slot=2", "policy.devices=[0]",
                                        "rollout.devices=[0]"],
    "colocated, 2 workers x 1 thread": ["cluster.cpu_slots=2", "policy.devices=[0,1]", "rollout.devices=[0,1]"],
    "hybrid, 2 policy ranks sample": ["cluster.cpu_slots=2", "policy.devices=[0,1]", "rollout.devices=[0,1]",
                                      "rollout.mode=hybrid"],
    "disaggregated, 1 + 1 slots": ["cluster.cpu_slots=2", "policy.devices=[0]", "rollout.devices=[1]"],
}
SMOKE = {"preset": "tiny", "steps": 2, "warmup": 1, "layouts": ["disaggregated, 1 + 1 slots"]}
"""--smoke: every run of a layout starts a Ray cluster and its workers (~20 s on 2 cores), so one layout
trains (the one with a weight sync between processes) and the others are only planned."""


def layout_config(model: str, data: Path, out: Path, steps: int, overrides: list[str]):
    from gyre.config import load_config

    return load_config(None, [
        f"run.output_dir={out}", f"run.steps={steps}", f"model.path={model}", f"data.train_files=[{data}]",
        "rollout.prompts_per_step=8", "rollout.samples_per_prompt=8", "rollout.sampling.max_new_tokens=32",
        "policy.micro_batch_size=64", "policy.optimizer.lr=1e-5", "logging.progress=false",
        "logging.trackers=[]", "logging.plot=false", *overrides])


def run_layout(model: str, data: Path, out: Path, steps: int, overrides: list[str]) -> list[dict]:
    from gyre.app import launch

    launch.train(layout_config(model, data, out, steps, overrides), echo=lambda s: None)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="the smallest run of the same path (SMOKE)")
    args = ap.parse_args()
    vars(args).update(SMOKE if args.smoke else {"layouts": list(LAYOUTS)})
    from gyre.app.preflight import preflight
    from gyre.models.presets import init_model
    from gyre.tasks.arithmetic import write_arithmetic_task

    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        model = str(init_model(args.preset, tmp / "model"))
        data = write_arithmetic_task(tmp / "data")["train"]
        for i, (name, overrides) in enumerate(LAYOUTS.items()):
            if name not in args.layouts:  # planned as a run would be (config, placement), not trained
                preflight(layout_config(model, data, tmp / f"run{i}", args.steps, overrides), None)
        print(f"preset {args.preset}, 8 prompts x 8 samples x <= 32 new tokens; mean seconds after "
              f"{args.warmup} warm-up steps")
        print(f"{'layout':<34}" + "".join(f"{p:>12}" for p in (*PHASES, "other", "step", "gen tok/s")))
        for i, (name, overrides) in enumerate(LAYOUTS.items()):
            if name not in args.layouts:
                continue
            records = run_layout(model, data, tmp / f"run{i}", args.steps, overrides)[args.warmup:]
            mean = {p: statistics.mean(r[f"time/{p}"] for r in records) for p in (*PHASES, "step")}
            other = mean["step"] - sum(mean[p] for p in PHASES)
            tokens = statistics.mean(64 * r["response_length/mean"] / r["time/generate"] for r in records)
            cells = [mean[p] for p in PHASES] + [other, mean["step"]]
            print(f"{name:<34}" + "".join(f"{c:>12.3f}" for c in cells) + f"{tokens:>12.0f}", flush=True)


if __name__ == "__main__":
    main()
