"""The phase timeline of a run report: a Gantt chart with one lane per worker, and each role's idle fraction.

A worker is idle when none of its spans covers the moment; its idle fraction is over the run's recorded
window (the first span's start to the last span's end), so every lane is measured against the same span
of time. A role's idle fraction is the mean of its workers'.
"""

from __future__ import annotations

import html
from collections import defaultdict
from dataclasses import dataclass

from gyre.tracking.timeline import Span

ROLE_ORDER = ("driver", "policy", "rollout", "reference", "critic", "teacher", "reward", "env")
PHASE_COLORS = {"generate": "#1f77b4", "reward": "#2ca02c", "logprobs": "#9467bd", "train": "#d62728",
                "weight_sync": "#ff7f0e", "env_step": "#17becf", "validate": "#8c564b", "checkpoint": "#7f7f7f",
                "report": "#c7c7c7"}
_OTHER_COLORS = ("#e377c2", "#bcbd22", "#aec7e8", "#98df8a")


def _phase_order(phase: str) -> tuple:
    """The known phases in their pipeline order, then any other by name."""
    known = list(PHASE_COLORS)
    return (known.index(phase), "") if phase in known else (len(known), phase)


def lane_label(role: str, rank: int) -> str:
    return f"{role} {rank}"


def lanes_of(spans: list[Span]) -> list[tuple[str, int]]:
    """Every (role, rank) with a span, in role order, then rank."""
    order = {r: i for i, r in enumerate(ROLE_ORDER)}
    return sorted({(s.role, s.rank) for s in spans}, key=lambda lane: (order.get(lane[0], len(order)), lane))


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of ``intervals`` (overlaps counted once)."""
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


@dataclass(frozen=True)
class RoleIdle:
    """How busy one role's workers were over the run's recorded window."""

    role: str
    workers: int
    busy_s: float
    """Mean busy seconds per worker (the union of its spans)."""
    idle_fraction: float
    """Mean over the role's workers of 1 - busy / window."""
    phase_s: dict[str, float]
    """Seconds per phase, summed over the role's workers."""


def idle_by_role(spans: list[Span]) -> tuple[list[RoleIdle], float]:
    """Each role's idle fraction (the driver aside: it waits on the others by design) and the window's seconds."""
    work = [s for s in spans if s.role != "driver"]
    if not work:
        return [], 0.0
    window = max(s.end for s in work) - min(s.start for s in work)
    per_lane: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    per_phase: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for s in work:
        per_lane[(s.role, s.rank)].append((s.start, s.end))
        per_phase[s.role][s.phase] += s.end - s.start
    out = []
    for role in dict.fromkeys(role for role, _ in lanes_of(work)):
        busy = [busy_seconds(iv) for (r, _), iv in per_lane.items() if r == role]
        idle = [1 - b / window if window > 0 else 0.0 for b in busy]
        out.append(RoleIdle(role, len(busy), sum(busy) / len(busy), sum(idle) / len(idle), dict(per_phase[role])))
    return out, window


def gantt_figure(spans: list[Span]):
    """One horizontal bar per span (x: seconds since the first span), one lane per worker, one colour per phase."""
    import plotly.graph_objects as go

    t0 = min(s.start for s in spans)
    lanes = lanes_of(spans)
    labels = [lane_label(*lane) for lane in lanes]
    by_phase: dict[str, list[Span]] = defaultdict(list)
    for s in spans:
        by_phase[s.phase].append(s)
    by_phase = dict(sorted(by_phase.items(), key=lambda item: _phase_order(item[0])))
    fig = go.Figure()
    extra = iter(_OTHER_COLORS * 8)
    for name, mine in by_phase.items():
        color = PHASE_COLORS.get(name) or next(extra, "#333333")
        fig.add_trace(go.Bar(
            orientation="h", name=html.escape(name), marker={"color": color, "line": {"width": 0}},
            y=[lane_label(s.role, s.rank) for s in mine], base=[s.start - t0 for s in mine],
            x=[max(s.end - s.start, 1e-4) for s in mine],
            customdata=[[s.step, s.end - s.start, s.start - t0] for s in mine],
            hovertemplate=(f"{html.escape(name)}<br>%{{y}}<br>step %{{customdata[0]}}<br>"
                           "start %{customdata[2]:.3f} s, duration %{customdata[1]:.3f} s<extra></extra>")))
    fig.update_layout(barmode="overlay", height=140 + 28 * len(lanes), template="plotly_white",
                      margin={"l": 90, "r": 10, "t": 30, "b": 40}, xaxis_title="seconds since the first span",
                      legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"}, bargap=0.25)
    fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(labels)), type="category")
    return fig


def idle_table(rows: list[RoleIdle], window: float) -> str:
    """An HTML table of each role's workers, busy seconds, idle fraction and seconds per phase."""
    phases = sorted({p for r in rows for p in r.phase_s}, key=_phase_order)
    head = "".join(f"<th>{html.escape(p)} (s)</th>" for p in phases)
    body = []
    for r in rows:
        cells = "".join(f"<td>{r.phase_s.get(p, 0.0):.2f}</td>" for p in phases)
        body.append(f"<tr><td>{html.escape(r.role)}</td><td>{r.workers}</td><td>{r.busy_s:.2f}</td>"
                    f"<td>{r.idle_fraction:.1%}</td>{cells}</tr>")
    return (f"<p>Over the recorded window of {window:.1f} s (first to last span). Busy: the union of a worker's "
            "spans, averaged over the role's workers.</p>"
            "<table class='data' id='idle-table'><tr><th>role</th><th>workers</th><th>busy per worker (s)</th>"
            f"<th>idle fraction</th>{head}</tr>{''.join(body)}</table>")
