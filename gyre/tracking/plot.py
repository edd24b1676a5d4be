"""A PNG plot of training reward and accuracy (train and held-out) against step."""

from __future__ import annotations

from pathlib import Path

from gyre.tracking.logger import read_metrics


def plot_run(metrics_path: str | Path, out_path: str | Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [r for r in read_metrics(metrics_path) if r.get("phase") == "train"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    series = [
        (axes[0], "reward/mean", "train reward (sampled)"),
        (axes[0], "val/reward/mean", "held-out reward"),
        (axes[1], "accuracy", "train accuracy (sampled)"),
        (axes[1], "val/accuracy", "held-out accuracy"),
    ]
    for ax, key, label in series:
        points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o" if key.startswith("val/") else None, markersize=3, label=label)
    for ax, ylabel in zip(axes, ("reward", "accuracy")):
        ax.set_xlabel("RL step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
    axes[1].set_ylim(-0.02, 1.02)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(out_path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
