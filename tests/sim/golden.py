"""Golden scheduler streams: the real scheduler's decisions under every admission regime, on the simulator.

A real run's stream depends on timing wherever the scheduler picks by finish time (window asynchrony,
redundancy, tail rounds), so ``tests/pipelines/golden`` can only pin the regimes that a seed reproduces.
The simulator drives the same scheduler on a virtual clock: each case below is deterministic, cheap, and
records per step when it ended, what trained, and the scheduler's counters. A refactor of the scheduler,
the rollout machine or the simulated cluster must reproduce them; a change meant to alter behaviour
rewrites them on purpose, with the reason in the commit:

    .venv/bin/python -m tests.sim.golden --write [CASE ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GOLDEN_DIR = Path(__file__).with_name("golden")

BASE = ["rollout.prompts_per_step=16", "rollout.samples_per_prompt=8", "rollout.sampling.max_new_tokens=4096",
        "simulate.steps=6", "simulate.warmup_steps=1", "simulate.devices=16"]
AGENTIC = ["rollout.prompts_per_step=8", "rollout.samples_per_prompt=4", "simulate.steps=5",
           "simulate.warmup_steps=1", "simulate.devices=8", "simulate.workload.env_latency_s=2.0"]

CASES: dict[str, tuple[str, list[str]]] = {
    "sync": ("examples/math_boxed.yaml", BASE),
    "queue": ("examples/math_boxed.yaml", [*BASE, "rollout.schedule=queue"]),
    "window_1": ("examples/math_boxed.yaml", [*BASE, "rollout.async_ratio=1"]),
    "window_half_slots": ("examples/math_boxed.yaml", [*BASE, "rollout.async_ratio=0.5",
                                                       "rollout.max_batch_size=32"]),
    "window_2_restart": ("examples/math_boxed.yaml", [*BASE, "rollout.async_ratio=2", "rollout.partial=false"]),
    "lockstep_1": ("examples/math_boxed.yaml", [*BASE, "rollout.async_ratio=1", "rollout.async_mode=lockstep"]),
    "lockstep_dynamic": ("examples/math_boxed.yaml", [*BASE, "rollout.async_ratio=1.5", "rollout.async_mode=lockstep",
                                                      "rollout.dynamic_sampling={}"]),
    "redundancy": ("examples/math_boxed.yaml", [*BASE, "rollout.redundancy=4", "rollout.schedule=queue"]),
    "dynamic_sampling": ("examples/math_boxed.yaml", [*BASE, "rollout.dynamic_sampling={}"]),
    "tail_rounds": ("examples/math_boxed.yaml", [*BASE, "rollout.tail_batching={}", "rollout.schedule=queue"]),
    "elastic_spot": ("examples/math_boxed.yaml", [*BASE, "rollout.async_ratio=1", "simulate.elastic.lent=8",
                                                  "simulate.elastic.on_s=20", "simulate.elastic.off_s=10",
                                                  "simulate.elastic.warning_s=5"]),
    "agentic_sync": ("examples/agentic_guess_number.yaml", AGENTIC),
    "agentic_window": ("examples/agentic_guess_number.yaml", [*AGENTIC, "rollout.async_ratio=1"]),
}


def run_case(name: str) -> list[dict]:
    """Case ``name``'s stream: per step, its end (virtual seconds), what trained and the counters."""
    from gyre.config.load import load_config
    from gyre.sim.run import simulate
    from gyre.sim.scenario import scenario

    path, overrides = CASES[name]
    result = simulate(scenario(load_config(path, overrides)))
    return [{"step": s.step, "end": s.end, "samples": s.samples, "response_tokens": s.response_tokens,
             "engines": s.engines, **s.stats} for s in result.steps]


def differences(expected: list[dict], actual: list[dict]) -> list[str]:
    """Where ``actual`` departs from ``expected`` (floats within 1e-9 relative: the clock is a sum of costs)."""
    if len(expected) != len(actual):
        return [f"{len(actual)} steps, golden {len(expected)}"]
    problems = []
    for want, got in zip(expected, actual):
        for key in sorted({*want, *got}):
            a, b = want.get(key), got.get(key)
            same = a == b or (isinstance(a, float) and isinstance(b, float) and abs(a - b) <= 1e-9 * max(1, abs(a)))
            if not same:
                problems.append(f"step {want['step']}: {key} = {b!r}, golden {a!r}")
    return problems


def main(argv: list[str]) -> int:
    if "--write" not in argv:
        print(__doc__)
        return 2
    GOLDEN_DIR.mkdir(exist_ok=True)
    for name in [n for n in CASES if n in argv] or CASES:
        records = run_case(name)
        (GOLDEN_DIR / f"{name}.json").write_text(json.dumps(records, indent=0, sort_keys=True) + "\n")
        print(f"wrote {GOLDEN_DIR / name}.json ({len(records)} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
