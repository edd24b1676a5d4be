"""The curves of a run report: one small chart per panel, raw values faint and their EMA bold beside them
(the debiased EMA of ``metrics.png``, its weight growing with the run's length).

A panel names metric keys (exact, or a pattern with ``{d}`` for every domain of a multi-domain run);
keys a run did not log are left out, and a panel with none is not drawn. Fractions and accuracies share
the 0-1 scale; the others scale to their data. Throughput is derived from the logged step times and the
samples and response tokens each step trained.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

from gyre.tracking.plot import ema, smoothing_weight  # the same smoothing as metrics.png

_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
            "#17becf")


@dataclass(frozen=True)
class Chart:
    """One chart of the curves section."""

    title: str
    keys: tuple[str, ...]
    """Metric keys drawn, in order; ``{d}`` stands for each domain."""
    unit_range: bool = False
    """A 0-1 quantity (accuracy, a fraction): the y-axis spans [0, 1] for every run alike."""
    smooth: bool = True


CHARTS = (
    Chart("Reward", ("reward/mean", "val/reward/mean", "{d}/reward_mean", "val/{d}/reward_mean")),
    Chart("Accuracy", ("accuracy", "val/accuracy", "{d}/accuracy", "val/{d}/accuracy"), unit_range=True),
    Chart("Policy loss", ("pg_loss", "distill/loss")),
    Chart("Critic loss", ("critic/value_loss",)),
    Chart("KL", ("approx_kl", "kl_ref", "kl_reward/kl", "distill/reverse_kl", "logprob_mismatch")),
    Chart("Entropy", ("entropy",)),
    Chart("Response length (tokens)", ("response_length/mean", "response_length/max", "val/response_length/mean")),
    Chart("Clip and truncation fractions", ("clip_frac", "clip_frac_high", "clip_frac_low", "critic/value_clip_frac",
                                            "response_length/truncated_frac", "mismatch/filtered_frac"),
          unit_range=True),
    Chart("Staleness (policy versions)", ("staleness/mean", "staleness/max")),
    Chart("Throughput (samples/s)", ("throughput/samples_per_s",)),
    Chart("Throughput (response tokens/s)", ("throughput/tokens_per_s",)),
    Chart("Step time (s)", ("time/step", "time/generate", "time/reward", "time/logprobs", "time/train",
                            "time/weight_sync", "time/validate")),
    Chart("Idle fraction", ("idle/rollout", "idle/policy"), unit_range=True),
    Chart("Gradient norm", ("grad_norm", "critic/grad_norm")),
)
SFT_CHART = Chart("SFT warm-up loss", ("sft_loss",))
DPO_CHARTS = (
    Chart("DPO loss", ("dpo_loss", "nll_loss")),
    Chart("DPO preference accuracy", ("rewards/accuracies",), unit_range=True),
    Chart("DPO implicit rewards", ("rewards/margins", "rewards/chosen", "rewards/rejected")),
    Chart("DPO step time (s)", ("time/step",)),
)
"""A ``gyre dpo`` run's charts (its records have phase ``dpo``; x: optimizer steps)."""


def with_throughput(records: list[dict]) -> list[dict]:
    """Records with samples/s and response tokens/s of each step: the trajectories it trained
    (``batch/samples``) and their sampled tokens (``batch/response_tokens``) over its time. Records
    without these counts (runs from before they were logged) get no throughput."""
    out = []
    for r in records:
        step_s, samples, tokens = r.get("time/step"), r.get("batch/samples"), r.get("batch/response_tokens")
        extra = {}
        if step_s and samples is not None:
            extra["throughput/samples_per_s"] = samples / step_s
        if step_s and tokens is not None:
            extra["throughput/tokens_per_s"] = tokens / step_s
        out.append({**r, **extra})
    return out


def domains_of(records: list[dict]) -> list[str]:
    """The domains of a multi-domain run: the ``<d>`` of its ``<d>/accuracy`` keys."""
    found = {m.group(1) for r in records for k in r if (m := re.fullmatch(r"([^/]+)/accuracy", k))}
    return sorted(found - {"val"})


def panel_keys(panel: Chart, present: set[str], domains: list[str]) -> list[str]:
    keys = []
    for key in panel.keys:
        for k in ([key.replace("{d}", d) for d in domains] if "{d}" in key else [key]):
            if k in present and k not in keys:
                keys.append(k)
    return keys


def panel_figure(panel: Chart, records: list[dict], keys: list[str], x_title: str = "RL step"):
    """A plotly figure: per key, its raw points (faint) and EMA (bold; validation points are sparse: markers)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for i, key in enumerate(keys):
        points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
        if not points:
            continue
        xs, ys = zip(*points)
        color, label = _PALETTE[i % len(_PALETTE)], html.escape(key)
        weight = smoothing_weight(len(points))
        sparse = key.startswith("val/") or not panel.smooth or weight == 0
        fig.add_trace(go.Scatter(x=xs, y=ys, name=label + ("" if sparse else " (raw)"), legendgroup=label,
                                 mode="lines+markers" if sparse else "lines", opacity=1.0 if sparse else 0.3,
                                 line={"color": color, "width": 1.5 if sparse else 1}))
        if not sparse:
            fig.add_trace(go.Scatter(x=xs, y=ema(ys, weight), name=f"{label} (EMA {weight:.2f})", legendgroup=label,
                                     mode="lines", line={"color": color, "width": 2.5}))
    fig.update_layout(title={"text": html.escape(panel.title), "x": 0.02}, height=340,
                      margin={"l": 50, "r": 10, "t": 40, "b": 10}, template="plotly_white", xaxis_title=x_title,
                      legend={"font": {"size": 10}, "orientation": "h", "y": -0.25, "yanchor": "top"})
    if panel.unit_range:
        fig.update_yaxes(range=[-0.02, 1.02])
    if len({r["step"] for r in records}) <= 12:  # a short run: whole steps only
        fig.update_xaxes(dtick=1)
    return fig


def curve_figures(records: list[dict]) -> list:
    """The figures of every panel the run's records have data for (RL steps; SFT and DPO steps apart)."""
    rl = with_throughput([r for r in records if r.get("phase", "train") == "train"])
    figures = _panels(CHARTS, rl, "RL step")
    sft = [r for r in records if r.get("phase") == "sft"]
    if sft:
        figures.append(panel_figure(SFT_CHART, sft, ["sft_loss"], "SFT step"))
    figures += _panels(DPO_CHARTS, [r for r in records if r.get("phase") == "dpo"], "DPO step")
    return figures


def _panels(charts: tuple[Chart, ...], records: list[dict], x_title: str) -> list:
    present = {k for r in records for k in r}
    domains = domains_of(records)
    figures = []
    for panel in charts:
        keys = panel_keys(panel, present, domains)
        if keys:
            figures.append(panel_figure(panel, records, keys, x_title))
    return figures
