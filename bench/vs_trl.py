"""gyre vs TRL's GRPOTrainer, side by side: same tiny model, task, batch and sampling, fp32, on CPU.

Batch: 8 prompts x 8 samples x up to 32 new tokens, one optimizer step per batch, no reference model.
Each framework runs in its own subprocess, one after the other and never at the same time, in
alternating rounds (machine speed drifts by tens of percent over minutes here, so a single pair of
runs can mislead). Seconds per step are the wall-clock gaps between consecutive steps after warm-up
steps are dropped; the figure reported per framework is the median over all rounds' steps.

gyre with ``rollout.backend=vllm`` (``gyre:vllm*``) runs where vLLM imports (``make setup-vllm``, then
``.venv-vllm/bin/python bench/vs_trl.py``); elsewhere those layouts are named as skipped. TRL is measured
with its default generation (``transformers``' ``generate``): its ``use_vllm`` colocate mode fails on
vLLM's CPU build at the first weight sync (vLLM 0.32 repacks CPU linear weights, so the ``load_weights``
that TRL calls finds no ``weight_loader``), so on this machine TRL has no vLLM path to compare with.

``--smoke``: the smallest run of the same path: the tiny model, one round of 2 steps of gyre (hybrid, and
gyre:vllm1x2 where vLLM imports) and of TRL; the other gyre layouts are planned (config and placement
checked), not trained.

    python bench/vs_trl.py [--preset small] [--steps 14] [--warmup 4] [--rounds 2] [--runs RUN ...] [--smoke]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPTS, SAMPLES, NEW_TOKENS, LR = 8, 8, 32, 1e-5
RUNS = ("gyre:hybrid", "trl", "gyre:hybrid1x2", "gyre:2x1", "gyre:async1", "gyre:vllm1x2", "gyre:vllm2x1")
SYNC = ("gyre:hybrid", "gyre:hybrid1x2", "gyre:2x1")
"""The synchronous layouts of the HF engine; the vLLM ones are compared with TRL on their own line."""
VLLM = ("gyre:vllm1x2", "gyre:vllm2x1")
"""Synchronous, rollout on vLLM: one engine of 2 threads beside the policy, or one engine per slot."""
"""TRL's own setting is synchronous; the asynchronous figure (alpha 1, rollout and policy on one slot each)
is printed beside it, not compared as the same thing."""
SMOKE = {"preset": "tiny", "steps": 2, "warmup": 0, "rounds": 1, "runs": ("gyre:hybrid", "trl", "gyre:vllm1x2")}
"""--smoke: each run is a process that starts its own workers (20-40 s on 2 cores), so one gyre layout trains."""


def exact_match(completions, ground_truth, **kwargs):
    """The reward both frameworks use: 1.0 when the completion is exactly the integer answer."""
    return [float(c.strip() == g) for c, g in zip(completions, ground_truth)]


def gyre_reward(response: str, ground_truth: str) -> float:
    return exact_match([response], [ground_truth])[0]


def gyre_config(model: str, data: Path, out: Path, steps: int, layout: str):
    from gyre.config import load_config

    devices = {
        "1x2": ["cluster.cpu_slots=1", "cluster.threads_per_slot=2", "policy.devices=[0]", "rollout.devices=[0]"],
        "2x1": ["cluster.cpu_slots=2", "policy.devices=[0,1]", "rollout.devices=[0,1]"],
        "hybrid": ["cluster.cpu_slots=2", "policy.devices=[0,1]", "rollout.devices=[0,1]", "rollout.mode=hybrid"],
        "hybrid1x2": ["cluster.cpu_slots=1", "cluster.threads_per_slot=2", "policy.devices=[0]",
                      "rollout.devices=[0]", "rollout.mode=hybrid"],
        "async1": ["cluster.cpu_slots=2", "policy.devices=[1]", "rollout.devices=[0]", "rollout.async_ratio=1"],
        "vllm1x2": ["cluster.cpu_slots=1", "cluster.threads_per_slot=2", "policy.devices=[0]", "rollout.devices=[0]",
                    "rollout.backend=vllm"],
        "vllm2x1": ["cluster.cpu_slots=2", "policy.devices=[0,1]", "rollout.devices=[0,1]", "rollout.backend=vllm"],
    }[layout]
    return load_config(None, [
        f"run.output_dir={out}", f"run.steps={steps}", f"model.path={model}", f"data.train_files=[{data}]",
        f"rollout.prompts_per_step={PROMPTS}", f"rollout.samples_per_prompt={SAMPLES}",
        f"rollout.sampling.max_new_tokens={NEW_TOKENS}", "policy.micro_batch_size=64", f"policy.optimizer.lr={LR}",
        "policy.grad_clip=1.0", "reward.type=function", f"reward.function={Path(__file__).resolve()}:gyre_reward",
        "logging.progress=false", "logging.trackers=[]", "logging.plot=false", *devices])


def run_gyre(model: str, data: Path, out: Path, steps: int, layout: str) -> list[float]:
    from gyre.app import launch

    launch.train(gyre_config(model, data, out, steps, layout), echo=lambda s: None)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["time"] for r in records if r["phase"] == "train"]


def run_trl(model: str, data: Path, out: Path, steps: int) -> list[float]:
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(2)
    stamps: list[float] = []

    class Stamp(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.time())

    tokenizer = AutoTokenizer.from_pretrained(model)
    config = GRPOConfig(
        output_dir=str(out), max_steps=steps, per_device_train_batch_size=PROMPTS * SAMPLES,
        num_generations=SAMPLES, max_completion_length=NEW_TOKENS, learning_rate=LR, bf16=False, use_cpu=True,
        beta=0.0, gradient_checkpointing=False, logging_steps=1000, save_strategy="no", report_to="none",
        max_grad_norm=1.0, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        dataloader_num_workers=0, disable_tqdm=True)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model), reward_funcs=[exact_match],
                          args=config, train_dataset=load_dataset("json", data_files=str(data), split="train"),
                          processing_class=tokenizer, callbacks=[Stamp()])
    trainer.train()
    return stamps


def step_gaps(stamps: list[float], warmup: int) -> list[float]:
    return [b - a for a, b in zip(stamps, stamps[1:])][warmup:]


def child(args) -> None:
    out = Path(args.out)
    if args.run == "trl":
        stamps = run_trl(args.model, Path(args.data), out, args.steps)
    else:
        stamps = run_gyre(args.model, Path(args.data), out, args.steps, args.run.split(":")[1])
    print("RESULT " + json.dumps(stamps))


def launch_child(run: str, model: str, data: Path, tmp: Path, steps: int, round_: int) -> list[float]:
    # A directory per round: gyre refuses to start a fresh run where one already is.
    cmd = [sys.executable, __file__, "--run", run, "--model", model, "--data", str(data),
           "--out", str(tmp / f"{run.replace(':', '_')}-{round_}"), "--steps", str(steps)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{run} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--run"), ap.add_argument("--model"), ap.add_argument("--data"), ap.add_argument("--out")
    ap.add_argument("--runs", nargs="+", choices=RUNS, default=RUNS, help="which to train (trl is always one)")
    ap.add_argument("--smoke", action="store_true", help="the smallest run of the same path (SMOKE)")
    args = ap.parse_args()
    if args.run:
        return child(args)
    if args.smoke:
        vars(args).update(SMOKE)
    args.runs = tuple(dict.fromkeys(["trl", *args.runs]))
    if importlib.util.find_spec("vllm") is None:
        print(f"vLLM is not installed: {', '.join(VLLM)} skipped (make setup-vllm; .venv-vllm/bin/python {__file__})")
        args.runs = tuple(run for run in args.runs if run not in VLLM)
    from gyre.app.preflight import preflight
    from gyre.models.presets import init_model
    from gyre.tasks.arithmetic import write_arithmetic_task

    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        model = str(init_model(args.preset, tmp / "model"))
        data = write_arithmetic_task(tmp / "data")["train"]
        for run in RUNS:
            if run.startswith("gyre:") and run not in args.runs:  # planned (config, placement), not trained
                preflight(gyre_config(model, data, tmp / "plan", args.steps, run.split(":")[1]), None)
        print(f"model preset {args.preset}; {PROMPTS} prompts x {SAMPLES} samples x <= {NEW_TOKENS} new tokens, fp32")
        runs = [run for run in RUNS if run in args.runs]
        gaps: dict[str, list[float]] = {run: [] for run in runs}
        for r in range(args.rounds):
            for run in runs if r % 2 == 0 else runs[::-1]:
                gaps[run] += step_gaps(launch_child(run, model, data, tmp, args.steps, r), args.warmup)
                print(f"  round {r + 1}: {run:<9} {statistics.median(gaps[run]):.3f} s/step so far", flush=True)
        median = {run: statistics.median(g) for run, g in gaps.items()}
        for run, value in median.items():
            print(f"{run:<9} median {value:.3f} s/step over {len(gaps[run])} steps")
        if any(run in median for run in SYNC):
            best = min(v for k, v in median.items() if k in SYNC)
            print(f"TRL / gyre (best synchronous layout) seconds per step: {median['trl'] / best:.2f}x")
        if "gyre:async1" in median:
            print(f"TRL / gyre asynchronous (alpha 1): {median['trl'] / median['gyre:async1']:.2f}x")
        if any(run in median for run in VLLM):
            fastest = min(VLLM, key=lambda run: median.get(run, float("inf")))
            ratio = median["trl"] / median[fastest]
            print(f"TRL / gyre with vLLM ({fastest.split(':')[1]}) seconds per step: {ratio:.2f}x")


if __name__ == "__main__":
    main()
