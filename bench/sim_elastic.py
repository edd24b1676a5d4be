"""Elastic and preemptible rollout capacity against a fixed pool of the same mean size, simulated.

On ``--devices`` simulated H100s (7B model, asynchronous RLVR, alpha = 1, a long-tailed 2,000-token
workload capped at 8,192), the rollout pool is one of:
- ``fixed``: 5/8 of the devices, one engine each, always there (the baseline);
- ``lent``: 3/8 always there, plus 1/2 lent on and off (mean ``--on`` / ``--off`` seconds, so the same
  mean size when on = off): serving capacity lent between bursts, taken back at once with the tokens its
  samples hold handed back and continued elsewhere (ROSE's emergency cut);
- ``spot-warn``: the same capacity as spot instances with a ``--warning`` second reclaim notice: no new work
  during the notice, then what is left is handed back;
- ``spot-kill``: reclaimed with no notice: the samples they held are regenerated.

Every scheduling decision (where requests go, what a leaving engine's samples become) is the real
``RolloutScheduler``'s. The table gives, per pool: the mean engines the run actually had (the on/off
processes are random), samples per second (and per engine) with the ratio to ``fixed``, seconds per
step, mean staleness of the trained groups (versions), tokens wasted per step (aborted, or lost with a
killed engine), and samples continued / regenerated from scratch per step.

``--smoke``: the same table at the smallest size (8 devices, 3 steps: one measured).

    python bench/sim_elastic.py [--devices 64 256] [--steps 12] [--on 60] [--off 60] [--warning 20] [--smoke]
"""

from __future__ import annotations

import argparse
import time

from gyre.config.catalog import MODELS, device_class
from gyre.rollout.scheduler import ScheduleSpec
from gyre.sim.cost import CostModel
from gyre.sim.elastic import ElasticSpec
from gyre.sim.run import Layout, SimRun, SimSpec
from gyre.sim.workload import WorkloadSpec
from gyre.types import SamplingParams

POOLS = ("fixed", "lent", "spot-warn", "spot-kill")
SMOKE = {"devices": [8], "steps": 3}


def spec(devices: int, pool: str, args: argparse.Namespace) -> SimSpec:
    """The run on ``devices`` with rollout pool ``pool`` (``POOLS``)."""
    train = devices * 3 // 8
    fixed = devices - train
    base, lent = devices * 3 // 8, (devices - train - devices * 3 // 8) * 2  # mean base + lent / 2 = fixed
    sched = ScheduleSpec(8, max(8, devices // 2), SamplingParams(max_new_tokens=8192), 0, async_ratio=1.0,
                         replicate=True)
    cost = CostModel(device_class("h100"), MODELS["7b"])
    work = WorkloadSpec(max_tokens=8192, response_tokens=2000)
    if pool == "fixed":
        return SimSpec(sched, Layout(devices, fixed, train, False), cost, work, steps=args.steps, seed=args.seed)
    warning = {"lent": 0.0, "spot-warn": args.warning, "spot-kill": None}[pool]
    elastic = ElasticSpec(lent, args.on, args.off, warning_s=warning, seed=args.seed)
    return SimSpec(sched, Layout(devices, base, train, False), cost, work, steps=args.steps, seed=args.seed,
                   elastic=elastic)


def measure(devices: int, pool: str, args: argparse.Namespace) -> dict[str, float]:
    run = SimRun(spec(devices, pool, args))
    result = run.run()
    rows = result.measured
    total = lambda key: sum(r.stats.get(key, 0.0) for r in result.steps)  # noqa: E731
    steps = len(result.steps)
    lost = run.elastic.tokens_lost if run.elastic else 0
    engines = run.elastic.mean_engines(rows[0].start, rows[-1].end) if run.elastic else run.spec.layout.engines
    return {"engines": engines, "samples_s": result.samples_per_s, "per_engine": result.samples_per_s / engines,
            "step_s": result.step_s, "staleness": result.mean("staleness/mean"),
            "wasted": (total("rollout/tokens_wasted") + lost) / steps,
            "continued": total("rollout/samples_continued") / steps,
            "requeued": total("rollout/samples_requeued") / steps,
            "violations": total("staleness/violations"), "wall_s": result.wall_s}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, nargs="+", default=[64, 256])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--on", type=float, default=60.0, help="mean seconds a lent / spot engine stays")
    p.add_argument("--off", type=float, default=60.0, help="mean seconds it is away")
    p.add_argument("--warning", type=float, default=20.0, help="spot reclaim notice (spot-warn)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="the smallest run of the same path (SMOKE)")
    args = p.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    t0 = time.perf_counter()
    print(f"on {args.on:.0f} s / off {args.off:.0f} s, notice {args.warning:.0f} s, {args.steps} steps "
          f"(first 2 left out), alpha 1, 7B on H100\n")
    print("| devices | pool | engines (mean) | samples/s | vs fixed | per engine | vs fixed | step s | staleness "
          "| tokens wasted/step | continued/step | regenerated/step |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for devices in args.devices:
        base = None
        for pool in POOLS:
            m = measure(devices, pool, args)
            assert m["violations"] == 0, (devices, pool)
            base = base or m
            print(f"| {devices} | {pool} | {m['engines']:.1f} | {m['samples_s']:.2f} | "
                  f"{m['samples_s'] / base['samples_s']:.2f} | {m['per_engine']:.3f} | "
                  f"{m['per_engine'] / base['per_engine']:.2f} | {m['step_s']:.1f} | {m['staleness']:.2f} | "
                  f"{m['wasted']:,.0f} | {m['continued']:.1f} | {m['requeued']:.1f} |")
    print(f"\n({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
