"""``metrics.png``: the run at a glance, one panel per quantity a user checks first.

Panels: reward and accuracy (train and held-out), the policy (and critic) loss, KL, response length and
entropy. Noisy per-step series are drawn faint with an exponential moving average on top (debiased, as
TensorBoard's smoothing, so the first points are not pulled towards 0); held-out points are drawn as
they are. Scales are fixed where the quantity has a natural range (accuracy 0..1, entropy and lengths
from 0), so two runs' plots can be compared by eye. A panel whose metrics a run does not log says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gyre.tracking.logger import read_metrics


@dataclass(frozen=True)
class Series:
    key: str
    """The metrics.jsonl key."""
    label: str
    smooth: bool = True
    """Draw the raw points faint and an EMA on top (held-out series are not smoothed)."""
    right: bool = False
    """On a second y-axis of its own (a quantity of another scale, e.g. the critic's loss beside the policy's)."""


@dataclass(frozen=True)
class Panel:
    title: str
    series: tuple[Series, ...]
    ylim: tuple[float | None, float | None] = (None, None)
    """Fixed bounds where the quantity has a natural range; None lets the data decide that end."""


PANELS = (
    Panel("reward", (Series("reward/mean", "train (sampled)"), Series("val/reward/mean", "held-out", False))),
    Panel("accuracy", (Series("accuracy", "train (sampled)"), Series("val/accuracy", "held-out", False)),
          (-0.02, 1.02)),
    Panel("loss", (Series("pg_loss", "policy loss"), Series("distill/loss", "distillation loss"),
                   Series("critic/value_loss", "critic value loss (right axis)", right=True))),
    Panel("KL", (Series("kl_ref", "KL to reference (loss)"), Series("kl_reward/kl", "KL in the reward"),
                 Series("approx_kl", "policy vs old (approx)"), Series("distill/reverse_kl", "reverse KL to teacher"))),
    Panel("response length (tokens)", (Series("response_length/mean", "train mean"),
                                       Series("response_length/max", "train max"),
                                       Series("val/response_length/mean", "held-out mean", False)), (0, None)),
    Panel("entropy", (Series("entropy", "policy entropy"),), (0, None)),
)


def ema(values: list[float], weight: float) -> list[float]:
    """Debiased exponential moving average: s_t = w s_{t-1} + (1 - w) x_t, divided by 1 - w^t."""
    out, acc = [], 0.0
    for i, x in enumerate(values, start=1):
        acc = weight * acc + (1 - weight) * x
        out.append(acc / (1 - weight ** i))
    return out


def smoothing_weight(points: int) -> float:
    """More smoothing for longer runs: about a tenth of the run's steps in the average (0 below 10 steps)."""
    if points < 10:
        return 0.0
    return min(0.98, 1 - 10 / points)


def plot_run(metrics_path: str | Path, out_path: str | Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [r for r in read_metrics(metrics_path) if r.get("phase") == "train"]
    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
    for ax, panel in zip(axes.flat, PANELS):
        _draw_panel(ax, panel, records)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(out_path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _draw_panel(ax, panel: Panel, records: list[dict]) -> None:
    lines, right = [], None
    for number, series in enumerate(panel.series):
        points = [(r["step"], r[series.key]) for r in records if isinstance(r.get(series.key), (int, float))]
        if not points:
            continue
        if series.right and right is None:
            right = ax.twinx()
        lines.append(_draw_series(right if series.right else ax, series, points, f"C{number}"))
    ax.set_title(panel.title)
    ax.set_xlabel("RL step")
    ax.grid(alpha=0.3)
    if lines:
        ax.legend(handles=lines, fontsize=8)
        low, high = panel.ylim
        ax.set_ylim(bottom=low, top=high)
    else:
        ax.text(0.5, 0.5, "not logged in this run", ha="center", va="center", transform=ax.transAxes, color="gray")


def _draw_series(ax, series: Series, points: list[tuple[int, float]], color: str):
    """The series' line (its EMA when smoothed, over the raw points drawn faint); returns the line for the legend."""
    xs, ys = (list(v) for v in zip(*points))
    if not series.smooth:
        return ax.plot(xs, ys, color=color, marker="o", markersize=3, label=series.label)[0]
    weight = smoothing_weight(len(ys))
    if weight:
        ax.plot(xs, ys, color=color, alpha=0.25, linewidth=0.8)
    return ax.plot(xs, ys if weight == 0 else ema(ys, weight), color=color, label=series.label)[0]
