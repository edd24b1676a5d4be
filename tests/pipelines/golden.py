"""Golden metric streams: seeded runs whose per-step metrics must not change when code is reshaped.

Each case is a short, seeded run (the quickstart recipe, and a PPO run that uses every role: separate
rollout engine, reference, critic, KL penalty, mismatch weights). Its metric stream, without wall-clock
fields, is committed under ``golden/``. A change meant to keep behaviour (a refactor) must reproduce it;
a change meant to alter behaviour rewrites it on purpose, with the reason in the commit:

    .venv/bin/python -m tests.pipelines.golden --write
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

GOLDEN_DIR = Path(__file__).with_name("golden")

CASES: dict[str, list[str]] = {
    # The quickstart recipe, shortened: SFT warm-up, then GRPO with hybrid rollout on two ranks.
    "quickstart": ["run.steps=4", "sft_warmup.steps=150", "validation.every=2", "data.max_val_prompts=32",
                   "checkpoint.every=0", "logging.progress=false"],
    # Every role in its own process: rollout engine, reference, critic; GAE, a KL reward penalty and
    # mismatch importance weights (old log-probs recomputed).
    "ppo_all_roles": ["algorithm.preset=ppo", "run.steps=3", "sft_warmup.steps=60", "validation.every=0",
                      "data.max_val_prompts=32", "checkpoint.every=0", "logging.progress=false",
                      "rollout.mode=separate", "cluster.cpu_slots=3", "rollout.devices=[0]", "policy.devices=[1,2]",
                      "reference.devices=[0]",
                      "critic.devices=[1,2]", "rollout.prompts_per_step=16", "rollout.samples_per_prompt=4",
                      "policy.mini_batch_size=32", "policy.micro_batch_size=32", "critic.micro_batch_size=32",
                      "algorithm.kl_reward_coef=0.01", "algorithm.mismatch.weight=token",
                      "algorithm.mismatch.filter=sequence"],
}


def _is_timing(key: str) -> bool:
    return key == "time" or key.startswith(("time/", "idle/")) or "latency" in key


def stream(metrics_file: Path) -> list[dict]:
    """The records of a metrics.jsonl without wall-clock fields."""
    out = []
    for line in metrics_file.read_text().splitlines():
        record = json.loads(line)
        out.append({k: v for k, v in record.items() if not _is_timing(k)})
    return out


def run_case(name: str, out: Path) -> list[dict]:
    """Run case ``name`` under ``out`` (model and data made there) and return its stream."""
    from gyre.cli import _quickstart_config
    from gyre.pipelines import launch

    cfg = _quickstart_config(out, CASES[name])
    launch.train(cfg, echo=lambda s: None)
    return stream(out / "metrics.jsonl")


def differences(expected: list[dict], actual: list[dict], rtol: float = 1e-6) -> list[str]:
    """Where ``actual`` departs from ``expected``: a missing step or key, or a value off by more than
    ``rtol`` (floats; integers and strings must be equal). Keys new in ``actual`` are allowed."""
    problems = []
    if [r.get("step") for r in expected] != [r.get("step") for r in actual]:
        return [f"steps {[r.get('step') for r in actual]} != {[r.get('step') for r in expected]}"]
    for want, got in zip(expected, actual):
        for key, value in want.items():
            if key not in got:
                problems.append(f"step {want['step']}: {key} missing")
            elif not _close(value, got[key], rtol):
                problems.append(f"step {want['step']}: {key} = {got[key]!r}, golden {value!r}")
    return problems


def _close(a, b, rtol: float) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=rtol, abs_tol=1e-12)
    return a == b


def main(argv: list[str]) -> int:
    import tempfile

    import ray

    if "--write" not in argv:
        print(__doc__)
        return 2
    ray.init(address="local", num_cpus=6, include_dashboard=False, log_to_driver=False)
    GOLDEN_DIR.mkdir(exist_ok=True)
    for name in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            records = run_case(name, Path(tmp) / name)
        (GOLDEN_DIR / f"{name}.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
        print(f"wrote {GOLDEN_DIR / name}.jsonl ({len(records)} records)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
