"""Fault drill: a run with faults injected at random moments against the same run uninterrupted.

Faults cycle over every role process of a run (policy ranks, the rollout engine, the reference model,
reward workers and their subprocesses) and the driver itself; each is SIGKILL or SIGSTOP (a stopped
process is never continued: the run must notice the stall). A killed driver is restarted with
``--resume auto``. The drill passes when the faulted run finishes and its metric stream (every
metric but timings and fault counters) and final weights equal the uninterrupted run's.

``--smoke``: the smallest drill of the same path, in a temporary directory: 6 steps, one fault (a reward
subprocess killed: the cheapest to recover from, so the drill stays short).

    python bench/fault_injection.py [--faults 20] [--steps 600] [--seed 0] [--out runs/fault-drill] [--smoke]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml

SMOKE = {"faults": 1, "steps": 6, "targets": ("reward_subprocess",)}
"""--smoke: one fault that costs no worker restart, so the two runs, each starting its own cluster, are most
of the time."""


def drill_config(out: Path, name: str, model: Path, data: dict, steps: int, restarts: int) -> Path:
    """Separate rollout engine, a reference model (KL), two reward workers: every role has a process."""
    cfg = {
        "run": {"name": name, "output_dir": str(out / name), "steps": steps, "seed": 5, "max_restarts": restarts},
        "model": {"path": str(model)},
        "data": {"train_files": [str(data["train"])], "val_files": [str(data["val"])], "max_val_prompts": 16},
        "rollout": {"devices": [0], "prompts_per_step": 8, "samples_per_prompt": 4,
                    "sampling": {"max_new_tokens": 6}},
        "policy": {"devices": [0, 1], "micro_batch_size": 16, "optimizer": {"lr": 0.001}},
        "reference": {"devices": [1]},
        "algorithm": {"preset": "grpo"},
        "reward": {"type": "math", "workers": 2, "processes": 1},
        "validation": {"every": 5},
        "checkpoint": {"every": 2, "keep_last": 2},
        "watchdog": {"call_timeout_s": 90, "stall_min_s": 8, "stall_factor": 10},
        "logging": {"progress": False, "trackers": ["tensorboard"], "plot": False},
    }
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def prepare(out: Path) -> tuple[Path, dict]:
    from gyre.models.presets import init_model
    from gyre.tasks.arithmetic import ArithmeticSpec, write_arithmetic_task

    model = out / "model"
    if not (model / "config.json").exists():
        init_model("tiny", model, seed=0)
    data = write_arithmetic_task(out / "data", ArithmeticSpec(val_size=50, sft_size=50))
    return model, data


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--faults", type=int, default=20)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/fault-drill")
    ap.add_argument("--targets", nargs="+", help="what the faults hit (default: every role and the driver)")
    ap.add_argument("--smoke", action="store_true", help="the smallest drill of the same path (SMOKE)")
    args = ap.parse_args()
    if not args.smoke:
        return drill(args, Path(args.out))
    vars(args).update(SMOKE)
    with tempfile.TemporaryDirectory() as tmp:
        drill(args, Path(tmp))


def drill(args, out: Path) -> None:
    from gyre.cluster.chaos import compare_runs, plan_faults, run_drill
    from gyre.rollout.ledger import audit
    from gyre.tracking.logger import read_jsonl_tolerant

    for old in out.glob("straight*"):
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    for old in out.glob("faulted*"):
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    out.mkdir(parents=True, exist_ok=True)
    model, data = prepare(out)
    straight = drill_config(out, "straight", model, data, args.steps, 0)
    faulted = drill_config(out, "faulted", model, data, args.steps, args.faults)
    t0 = time.monotonic()
    run_drill(straight, [], args.seed)
    straight_s = time.monotonic() - t0
    faults = plan_faults(args.faults, args.seed, **({"targets": tuple(args.targets)} if args.targets else {}))
    report = run_drill(faulted, faults, args.seed)  # one fault in each of --faults shares of the steps
    problems = compare_runs(out / "straight", out / "faulted")
    problems += [f"ledger: {p}" for p in audit(read_jsonl_tolerant(out / "faulted" / "ledger.jsonl"))]
    kinds = Counter(fault for _, fault, _ in report.injected)
    print(f"uninterrupted run: {straight_s:.0f} s; faulted run: {report.seconds:.0f} s "
          f"({len(report.injected)} of {len(faults)} faults injected, driver started {report.driver_starts} times)")
    for kind, n in sorted(kinds.items()):
        print(f"  {kind:<28}{n}")
    for (when, fault, pid), step in zip(report.injected, report.struck_after):
        print(f"  t={when:>6.1f} s  after step {step:<5}{fault:<24} pid {pid}")
    print("metric stream and final weights equal the uninterrupted run's; the ledger accounts for every prompt"
          if not problems else
          "DIFFERENCES:\n  " + "\n  ".join(problems[:20]))
    print(f"driver log: {report.log}")
    if problems or len(report.injected) < len(faults):  # a drill that did not hold fails its caller (make, CI)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
