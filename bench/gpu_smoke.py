"""GPU smoke check (``make gpu-smoke``): on one H100 or H200, in under 8 minutes, what CI cannot check, into
one summary file.

Sections, each in a process of its own with a time box (a crash, a hang or an out-of-memory error is
recorded and the run goes on): the model directory they share (prepare), (b) a policy trainer's offload
memory under DDP and FSDP2, (c) bf16 hybrid sampling, (d) the weight channel and its device-side staging
and checksums, (g) the packing mask's cost under sdpa and flex-attention, (e) the HF engine's throughput on
a 7B-shaped random model, (f) the memory pre-flight's estimates against the peaks (b) and (e) measured, and
(a) the tests that skip without a GPU. Without CUDA every section runs at a tiny size, or says what it
needs, in a couple of minutes; ``--smoke`` is that, smallest (CI's bench-smoke).

    python bench/gpu_smoke.py                      # GPU if there is one; summary to $OUT or runs/
    python bench/gpu_smoke.py --sections offload,transport --out /tmp/s.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@dataclass(frozen=True)
class Section:
    name: str
    module: str
    """Of bench/gpusmoke/."""
    item: str
    """The issue's letter for it."""
    title: str
    gpu_s: int
    """Time box on a GPU (the process's start and imports included)."""
    cpu_s: int


SECTIONS = (
    Section("prepare", "sections", "-", "versions, device, the shared model directory", 120, 90),
    Section("offload", "sections", "b", "policy trainer offload memory, DDP and FSDP2", 120, 90),
    Section("hybrid_bf16", "sections", "c", "bf16 hybrid sampling (HF engine under autocast)", 90, 60),
    Section("transport", "sections", "d", "weight channel: device staging, checksums, a publication", 90, 60),
    Section("packing", "engine", "g", "packing mask cost: sdpa block mask vs flex-attention", 150, 90),
    Section("engine_7b", "engine", "e", "HF engine throughput, 7B-shaped random model", 150, 60),
    Section("preflight", "checks", "f", "memory pre-flight estimate vs measured peaks", 45, 45),
    Section("gpu_tests", "checks", "a", "the tests CI skips (no GPU there)", 240, 120),
)
"""In running order: the longest and least predictable (the tests, which start Ray) last, so that it cannot
starve the measurements; the summary lists the issue's items a-g."""


def status_of(result: dict) -> str:
    """ok, skipped, or failed (some check in the result says ok: false)."""
    if "skipped" in result:
        return "skipped"

    def bad(value) -> bool:
        if isinstance(value, dict):
            return value.get("ok") is False or any(bad(v) for v in value.values())
        return False

    return "failed" if bad(result) else "ok"


def run_section(section: Section, args, work: Path, summary: dict, timeout: float, log) -> dict:
    """One section in a child process of its own session (killed whole at its time box)."""
    result_path = work / f"{section.name}.json"
    prior = work / "prior.json"
    prior.write_text(json.dumps(summary["sections"], default=str))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--run-section", section.name, "--work", str(work),
           "--size", summary["size"], "--result", str(result_path), "--budget", str(int(timeout))]
    if args.smoke:
        cmd.append("--smoke")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    start = time.monotonic()
    log.write(f"\n===== {section.name} ({section.title}); time box {timeout:.0f} s\n")
    log.flush()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        code = None
    entry = {"item": section.item, "title": section.title, "wall_s": round(time.monotonic() - start, 1)}
    result = json.loads(result_path.read_text()) if result_path.is_file() else None
    kept = {"result": result} if result else {}  # what a stopped or crashed section had saved
    if code is None:
        return {**entry, "status": "timeout", "error": f"stopped at its {timeout:.0f} s time box", **kept}
    if code != 0:
        return {**entry, "status": "failed", "error": f"the section's process exited with {code}", **kept}
    if result is None:
        return {**entry, "status": "failed", "error": "the section wrote no result"}
    if "exception" in result:
        return {**entry, "status": "failed", "error": result["exception"]}
    return {**entry, "status": status_of(result), "result": result}


def render(summary: dict) -> str:
    """The summary as a Markdown table (what the README quotes)."""
    lines = [f"GPU smoke check: {summary['size']} run, {summary['wall_s']} s, on {summary.get('device', '?')}", "",
             "| item | section | status | seconds | headline |", "|---|---|---|---|---|"]
    for name, s in summary["sections"].items():
        result = s.get("result", {})
        headline = result.get("headline") or result.get("skipped") or s.get("error", "")
        lines.append(f"| {s['item']} | {name} | {s['status']} | {s['wall_s']} | "
                     f"{str(headline).splitlines()[-1][:200] if headline else ''} |")
    return "\n".join(lines) + "\n"


def default_out() -> Path:
    """$OUT/gpu_smoke.json on a device machine (what comes back from it), else under runs/."""
    return Path(os.environ["OUT"]) / "gpu_smoke.json" if os.environ.get("OUT") else ROOT / "runs" / "gpu_smoke.json"


def orchestrate(args) -> int:
    import torch

    size = args.size if args.size != "auto" else ("gpu" if torch.cuda.is_available() else "cpu")
    # prepare always runs: the others load the model directory it writes.
    chosen = [s for s in SECTIONS if s.name == "prepare" or not args.sections or s.name in args.sections.split(",")]
    out = args.out or default_out()
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = {"size": size, "smoke": args.smoke, "budget_s": args.budget, "started": time.strftime("%Y-%m-%d %H:%M"),
               "sections": {}}
    start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="gyre-gpu-smoke-"))
    with open(out.with_suffix(".log"), "w") as log:
        for section in chosen:
            left = args.budget - (time.monotonic() - start)
            if "prepare" in summary["sections"] and summary["sections"]["prepare"]["status"] != "ok":
                entry = {"item": section.item, "title": section.title, "wall_s": 0, "status": "skipped",
                         "error": "prepare failed: no model directory"}
            elif left < 10:
                entry = {"item": section.item, "title": section.title, "wall_s": 0, "status": "skipped",
                         "error": f"out of time (budget {args.budget} s)"}
            else:
                box = section.gpu_s if size == "gpu" else section.cpu_s
                entry = run_section(section, args, work, summary, min(box, left), log)
            summary["sections"][section.name] = entry
            summary["wall_s"] = round(time.monotonic() - start, 1)
            summary["device"] = summary["sections"].get("prepare", {}).get("result", {}).get("device")
            out.write_text(json.dumps(summary, indent=1, default=str) + "\n")  # a killed run keeps what it had
            print(f"[{summary['wall_s']:6.1f} s] {section.name:<12} {entry['status']:<8} "
                  f"{entry.get('result', {}).get('headline') or entry.get('error', '')}"[:300], flush=True)
    shutil.rmtree(work, ignore_errors=True)
    out.with_suffix(".md").write_text(render(summary))
    print(f"summary: {out} (+ .md, .log); {summary['wall_s']} s", flush=True)
    return 0 if all(s["status"] in ("ok", "skipped") for s in summary["sections"].values()) else 1


def child(args) -> int:
    """``--run-section``: run one section here and write its result (or its error) as JSON."""
    sys.path.insert(0, str(HERE))
    from gpusmoke.common import Ctx

    section = next(s for s in SECTIONS if s.name == args.run_section)
    prior_path = args.work / "prior.json"
    ctx = Ctx(gpu=args.size == "gpu", work=args.work, root=ROOT, smoke=args.smoke, budget_s=args.budget,
              prior=json.loads(prior_path.read_text()) if prior_path.is_file() else {}, result_path=args.result)
    try:
        module = importlib.import_module(f"gpusmoke.{section.module}")
        result = getattr(module, section.name)(ctx)
    except Exception:  # noqa: BLE001 - the run goes on; the summary keeps the traceback
        traceback.print_exc()
        result = {"exception": traceback.format_exc()[-3000:]}
    ctx.save(result)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="summary JSON (default $OUT/gpu_smoke.json, else "
                        "runs/gpu_smoke.json); a .md table and a .log beside it")
    parser.add_argument("--size", choices=("auto", "gpu", "cpu"), default="auto")
    parser.add_argument("--sections", default="", help="comma-separated names (default: all)")
    parser.add_argument("--budget", type=float, default=450.0, help="seconds for the whole run")
    parser.add_argument("--smoke", action="store_true", help="the smallest run (CPU sizes; CI's bench-smoke)")
    parser.add_argument("--run-section", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_section:
        return child(args)
    if args.smoke:
        args.size = "cpu"
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
