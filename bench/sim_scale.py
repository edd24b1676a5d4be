"""How fast the simulator is: real seconds per simulated training step, from 8 to 1024 devices.

Qwen2.5-7B shape on H100s, 8k-token budget, long-tailed responses (mean 2000 tokens), the batch growing
with the cluster (devices / 2 prompts x 8 samples: 4096 samples per step at 1024 devices), for the
synchronous, queue-scheduled and asynchronous (alpha 2) schedules. The issue's bar: a 1024-device step
in well under a second.

``--smoke``: the same table at the smallest size (8 devices, 2 steps).

    python bench/sim_scale.py [--devices 8 64 256 1024] [--steps 6] [--smoke]
"""

from __future__ import annotations

import argparse

from gyre.config.catalog import MODELS, device_class
from gyre.rollout.scheduler import ScheduleSpec
from gyre.sim.cost import CostModel
from gyre.sim.run import Layout, SimSpec, simulate
from gyre.sim.workload import WorkloadSpec
from gyre.types import SamplingParams

SCHEDULES = {"sync": dict(async_ratio=0.0, replicate=False), "queue": dict(async_ratio=0.0, replicate=True),
             "async 2": dict(async_ratio=2.0, replicate=True)}
SMOKE = {"devices": [8], "steps": 2}


def spec(devices: int, name: str, steps: int) -> SimSpec:
    kw = SCHEDULES[name]
    schedule = ScheduleSpec(8, max(8, devices // 2), SamplingParams(1.0, 1.0, 0, 8192, ()), 0, **kw)
    rollout = devices if kw["async_ratio"] == 0 else max(1, devices * 5 // 8)
    layout = Layout(devices, rollout, devices if kw["async_ratio"] == 0 else devices - rollout, kw["async_ratio"] == 0)
    return SimSpec(schedule, layout, CostModel(device_class("h100"), MODELS["7b"]),
                   WorkloadSpec(response_tokens=2000, max_tokens=8192), steps=steps)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, nargs="+", default=[8, 64, 256, 1024])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--smoke", action="store_true", help="the smallest run of the same path (SMOKE)")
    args = ap.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    print("| devices | schedule | samples / step | events / step | simulated s / step | real s / step |")
    print("|---|---|---|---|---|---|")
    for devices in args.devices:
        for name in SCHEDULES:
            r = simulate(spec(devices, name, args.steps))
            print(f"| {devices} | {name} | {r.steps[-1].samples} | {r.events / args.steps:.0f} | {r.step_s:.1f} | "
                  f"{r.wall_s / args.steps:.3f} |", flush=True)


if __name__ == "__main__":
    main()
