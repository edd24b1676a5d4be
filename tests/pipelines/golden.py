"""Golden metric streams: seeded runs whose per-step metrics must not change when code is reshaped.

Each case is a short, seeded run (the quickstart recipe, and a PPO run that uses every role: separate
rollout engine, reference, critic, KL penalty, mismatch weights). Its metric stream, without wall-clock
fields, is committed under ``golden/``. A change meant to keep behaviour (a refactor) must reproduce it;
a change meant to alter behaviour rewrites it on purpose, with the reason in the commit:

    .venv/bin/python -m tests.pipelines.golden --write [CASE ...]

Float results depend on which CPU kernels run: the same code gave streams differing from step 9 on (a
grad norm off by 1e-6, growing through 150 SFT steps into different samples) on a machine with AVX-512
and AMX and on the one that recorded them. Each case therefore runs in a process of its own, with its own
private Ray, under ``PORTABLE_KERNELS``: PyTorch's baseline (non-vectorised) ATen kernels, MKL's
conditional-numerical-reproducibility mode and oneDNN's baseline ISA, the same code paths on any x86-64
machine, with one thread per worker (the recipe's default).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
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
                      "algorithm.kl.reward_coef=0.01", "algorithm.mismatch.weight=token",
                      "algorithm.mismatch.filter=sequence"],
    # Lockstep asynchrony (alpha 1) on a rollout engine of its own, with dynamic sampling's refills: the
    # publication hold, the plan's parts and refills of the oldest unsettled batch; old log-probs from the
    # sampler (the asynchronous default of algorithm.old_logprobs).
    "lockstep": ["run.steps=5", "sft_warmup.steps=60", "validation.every=0", "data.max_val_prompts=32",
                 "checkpoint.every=0", "logging.progress=false", "cluster.cpu_slots=3", "rollout.devices=[0]",
                 "rollout.mode=separate", "policy.devices=[1,2]", "rollout.prompts_per_step=16",
                 "rollout.samples_per_prompt=4", "rollout.async_ratio=1", "rollout.async_mode=lockstep",
                 "rollout.dynamic_sampling={}", "policy.micro_batch_size=64"],
    # Multi-turn: the agentic quickstart (guess-the-number in environment workers), shortened.
    "agentic": ["run.steps=3", "sft_warmup.steps=30", "validation.every=3", "env.val_episodes=16",
                "checkpoint.every=0", "logging.progress=false"],
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


PORTABLE_KERNELS = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41",
                    "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
"""Environment of a golden run: kernels that compute the same floats on any x86-64 CPU (module docstring)."""

ROOT = Path(__file__).resolve().parents[2]


def run_case(name: str, out: Path, timeout_s: float = 600) -> list[dict]:
    """Run case ``name`` under ``out`` (model and data made there) in a process of its own, with
    ``PORTABLE_KERNELS`` set before anything starts (its Ray workers inherit them), and return its stream."""
    env = {**os.environ, **PORTABLE_KERNELS}
    env.pop("RAY_ADDRESS", None)  # a private Ray, never one found on the machine
    result = subprocess.run([sys.executable, "-m", "tests.pipelines.golden", "--run", name, str(out)], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=timeout_s)
    if result.returncode != 0:
        raise RuntimeError(f"golden case {name} failed (exit {result.returncode}):\n{result.stderr[-4000:]}")
    return stream(out / "metrics.jsonl")


def _run_here(name: str, out: Path) -> None:
    """The body of ``run_case``'s process: the case's run, on a private Ray the launcher starts."""
    from gyre.app import launch
    from gyre.app.quickstarts import agentic_quickstart_config, quickstart_config

    make = agentic_quickstart_config if name == "agentic" else quickstart_config
    launch.train(make(out, CASES[name]), echo=lambda s: None)


NOISE_KEYS = {"logprob_mismatch": 1e-5, "pg_loss": 1e-7, "approx_kl": 1e-7, "ratio_abs_dev": 1e-7, "ratio_mean": 1e-7}
"""Keys that carry the sampler's float noise, with the absolute tolerance they get: the sampler's log-probs
are computed in whatever rows share a decoding step, which timing decides (multi-turn episodes ask for
turns as their environments answer), so they move by about 1e-8. ``logprob_mismatch`` measures that noise
itself; the ratio statistics and ``pg_loss`` take pi_old from the sampler in asynchronous runs, and
``pg_loss`` (a mean of advantage x ratio over advantages that sum to about 0) is small next to its
terms, so a relative tolerance on it measures the cancellation (the lockstep case's pg_loss of 2e-3
moved by 1.3e-8 between two machines). A real change in behaviour moves these by far more, and moves
the weights and every later step with them."""


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
            elif not _close(value, got[key], rtol, NOISE_KEYS.get(key, 1e-12)):
                problems.append(f"step {want['step']}: {key} = {got[key]!r}, golden {value!r}")
    return problems


def _close(a, b, rtol: float, atol: float) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=rtol, abs_tol=atol)
    return a == b


def main(argv: list[str]) -> int:
    import tempfile

    if argv[:1] == ["--run"]:
        _run_here(argv[1], Path(argv[2]))
        return 0
    if "--write" not in argv:
        print(__doc__)
        return 2
    GOLDEN_DIR.mkdir(exist_ok=True)
    for name in [n for n in CASES if n in argv] or CASES:  # the cases named, else all
        with tempfile.TemporaryDirectory() as tmp:
            records = run_case(name, Path(tmp) / name)
        (GOLDEN_DIR / f"{name}.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
        print(f"wrote {GOLDEN_DIR / name}.jsonl ({len(records)} records)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
