"""Run directories for the report tests: the edge cases a real tiny run does not produce, written by hand."""

from __future__ import annotations

import json
from pathlib import Path

INJECTION = "</script><script>alert(1)</script>"
"""A generation's text that would run if the page put it into the markup unescaped."""


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def generation(step: int, split: str, group: int, sample: int, response: str, turns=None) -> dict:
    """One line of generations/[val_]step_N.jsonl in the agreed format."""
    return {"step": step, "split": split, "group": group, "sample": sample, "domain": "math",
            "prompt": "What is 2+3? <b>not bold</b>", "response": response, "reward": 1.0 if sample else 0.0,
            "correct": bool(sample), "advantage": 0.5 if sample else -0.5, "weight_version": step - 1,
            "finish_reason": "stop", "response_tokens": 3, "turns": turns}


def add_generations(run_dir: Path, steps: list[int]) -> None:
    """Train generations at ``steps`` (one a multi-turn trajectory, one an injection attempt) and validation
    ones at the last step."""
    turns = [{"role": "assistant", "text": "guess 5", "reward": None},
             {"role": "env", "text": f"too high {INJECTION}", "reward": 0.0}]
    for step in steps:
        write_jsonl(run_dir / "generations" / f"step_{step}.jsonl",
                    [generation(step, "train", 0, 0, INJECTION), generation(step, "train", 0, 1, "5", turns)])
    write_jsonl(run_dir / "generations" / f"val_step_{steps[-1]}.jsonl",
                [generation(steps[-1], "val", 0, 0, "5")])


def hand_written_run(run_dir: Path) -> Path:
    """A multi-domain run's files: metrics with per-domain keys, a timeline with every role, an odd config."""
    records = [{"step": 0, "phase": "train", "val/accuracy": 0.1, "val/reward/mean": 0.1, "val/math/accuracy": 0.2}]
    for step in (1, 2, 3):
        records.append({"step": step, "phase": "train", "reward/mean": 0.1 * step, "accuracy": 0.1 * step,
                        "math/accuracy": 0.2, "code/accuracy": 0.3, "pg_loss": 0.01, "approx_kl": 0.001,
                        "entropy": 1.0, "response_length/mean": 4.0, "clip_frac": 0.1, "staleness/mean": 0.5,
                        "time/step": 2.0, "batch/rows": 8, "idle/rollout": 0.3})
    write_jsonl(run_dir / "metrics.jsonl", records)
    spans, t = [], 1000.0
    for step in (1, 2, 3):
        for role, rank, phase, a, b in (("rollout", 0, "generate", 0.0, 0.8), ("rollout", 1, "generate", 0.0, 0.6),
                                        ("reward", 0, "reward", 0.2, 0.9), ("env", 0, "env_step", 0.1, 0.5),
                                        ("reference", 0, "logprobs", 0.9, 1.0), ("critic", 0, "train", 1.0, 1.2),
                                        ("policy", 0, "train", 1.0, 1.3), ("policy", 0, "weight_sync", 1.3, 1.4),
                                        ("driver", 0, "validate", 1.4, 1.5)):
            spans.append({"role": role, "rank": rank, "phase": phase, "start": t + a, "end": t + b, "step": step})
        t += 1.5
    write_jsonl(run_dir / "timeline.jsonl", spans)
    (run_dir / "resolved_config.yaml").write_text(f"run:\n  name: '{INJECTION}'\n")
    (run_dir / "validation.md").write_text("# Held-out validation\n\n| step | accuracy | reward |\n|---|---|---|\n"
                                           "| 0 | 10.0% | 0.100 |\n")
    (run_dir / "run_info.json").write_text(json.dumps({
        "gyre": "0.1.0", "torch": "2", "transformers": "4", "ray": "2", "python": "3.11", "git_commit": None,
        "placement": f"placement: 2 CPU slot(s) {INJECTION}", "started": "2026-01-01T00:00:00+00:00"}))
    add_generations(run_dir, [1, 3])
    return run_dir


def long_run(run_dir: Path, steps: int = 2000, spans_per_step: int = 50, train_files: int = 30,
             val_files: int = 12) -> Path:
    """A long run's files: ``steps`` steps of ``spans_per_step`` spans each (a reward span per sample, as a
    run with a slow reward writes) and more generations files than the page embeds."""
    lanes = [("rollout", r, "generate") for r in range(4)] + [("reward", r, "reward") for r in range(4)] + \
        [("policy", 0, "train"), ("policy", 1, "train")]
    spans, t = [], 1000.0
    for step in range(1, steps + 1):
        for i in range(spans_per_step):
            role, rank, phase = lanes[i % len(lanes)]
            spans.append({"role": role, "rank": rank, "phase": phase, "start": round(t + 0.02 * i, 4),
                          "end": round(t + 0.02 * i + 0.015, 4), "step": step})
        t += 2.0
    write_jsonl(run_dir / "timeline.jsonl", spans)
    write_jsonl(run_dir / "metrics.jsonl", [{"step": s, "phase": "train", "reward/mean": 0.1, "time/step": 2.0,
                                             "batch/samples": 8, "batch/response_tokens": 40}
                                            for s in range(1, steps + 1)])
    for step in range(1, train_files + 1):
        write_jsonl(run_dir / "generations" / f"step_{step}.jsonl", [generation(step, "train", 0, 0, "5" * 500)])
    for step in range(1, val_files + 1):
        write_jsonl(run_dir / "generations" / f"val_step_{step}.jsonl", [generation(step, "val", 0, 0, "5")])
    return run_dir
