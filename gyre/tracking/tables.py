"""The held-out validation table of a run (``validation.md``): accuracy per step, overall and per domain."""

from __future__ import annotations

from pathlib import Path

from gyre.tracking.logger import read_metrics


def validation_table(metrics_path: str | Path, domains: list[str]) -> str:
    """A Markdown table with one row per validation: overall accuracy and reward, then each domain's."""
    rows = [r for r in read_metrics(metrics_path) if "val/accuracy" in r]
    head = ["step", "accuracy", "reward"] + [f"{d} accuracy" for d in domains]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r["step"]), f"{r['val/accuracy']:.1%}", f"{r['val/reward/mean']:.3f}"]
        cells += [f"{r[f'val/{d}/accuracy']:.1%}" if f"val/{d}/accuracy" in r else "-" for d in domains]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_validation_table(metrics_path: str | Path, out_path: str | Path, domains: list[str]) -> Path:
    out = Path(out_path)
    out.write_text("# Held-out validation\n\n" + validation_table(metrics_path, domains))
    return out
