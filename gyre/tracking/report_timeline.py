"""The phase timeline of a run report: a Gantt chart with one lane per worker, and each role's idle fraction.

A worker is idle when none of its spans covers the moment. Idle fractions are over the run's recorded
sessions: the time from the first span to the last, less the gaps in which no worker had any span for
long (the downtime across a resume or a recovery), so every lane is measured against the same time. A
role's idle fraction is the mean of its workers'. The chart shows only the last steps (a long run's
spans would make the page too large to load) and merges spans closer than it can draw apart; the idle
table covers the whole run.
"""

from __future__ import annotations

import html
from collections import defaultdict
from dataclasses import dataclass

from gyre.tracking.timeline import Span

GANTT_STEPS = 20
"""The chart draws the spans of this many last steps."""
GANTT_RESOLUTION = 1 / 1500
"""Spans of one lane and phase closer than this share of the chart's time range are drawn as one bar."""
GAP_MIN_S = 60.0
GAP_STEPS = 5
"""A stretch with no worker span is downtime (a resume, a recovery) when it is longer than GAP_MIN_S seconds
and than GAP_STEPS median step times."""
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
    """The lane's name on the chart (escaped: plotly renders some HTML in labels; role names come from a file)."""
    return html.escape(f"{role} {rank}")


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


def step_seconds(spans: list[Span]) -> float:
    """The median over steps of the time from a step's first span to its last (0 with no spans)."""
    extent: dict[int, list[float]] = {}
    for s in spans:
        lo_hi = extent.setdefault(s.step, [s.start, s.end])
        lo_hi[0], lo_hi[1] = min(lo_hi[0], s.start), max(lo_hi[1], s.end)
    lengths = sorted(hi - lo for lo, hi in extent.values())
    return lengths[len(lengths) // 2] if lengths else 0.0


def sessions(spans: list[Span]) -> list[tuple[float, float]]:
    """The stretches of the run with spans: split where no span covers more than the downtime threshold
    (GAP_MIN_S seconds and GAP_STEPS median step times)."""
    if not spans:
        return []
    gap = max(GAP_MIN_S, GAP_STEPS * step_seconds(spans))
    ordered = sorted(spans, key=lambda s: s.start)
    out, (lo, hi) = [], (ordered[0].start, ordered[0].end)
    for s in ordered[1:]:
        if s.start - hi > gap:
            out.append((lo, hi))
            lo, hi = s.start, s.end
        else:
            hi = max(hi, s.end)
    return out + [(lo, hi)]


def idle_by_role(spans: list[Span]) -> tuple[list[RoleIdle], float]:
    """Each role's idle fraction (the driver aside: it waits on the others by design) and the recorded
    seconds (the sessions' summed length)."""
    work = [s for s in spans if s.role != "driver"]
    if not work:
        return [], 0.0
    window = sum(b - a for a, b in sessions(work))
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


@dataclass(frozen=True)
class Bar:
    """One bar of the chart: one span, or several close spans of one lane and phase merged."""

    role: str
    rank: int
    phase: str
    start: float
    end: float
    first_step: int
    last_step: int
    """The steps of the merged spans range from first_step to last_step."""

    @property
    def steps(self) -> str:
        return str(self.first_step) if self.first_step == self.last_step else f"{self.first_step}-{self.last_step}"


def gantt_window(spans: list[Span], steps: int = GANTT_STEPS) -> tuple[list[Span], int, int]:
    """The spans of the last ``steps`` steps, and the first and last step shown."""
    shown_steps = sorted({s.step for s in spans})[-steps:]
    first = shown_steps[0]
    return [s for s in spans if s.step >= first], first, shown_steps[-1]


def merge_bars(spans: list[Span], resolution: float = GANTT_RESOLUTION) -> list[Bar]:
    """The spans as bars, those of one lane and phase less than ``resolution`` of the time range apart merged."""
    if not spans:
        return []
    gap = resolution * (max(s.end for s in spans) - min(s.start for s in spans))
    bars: list[Bar] = []
    last: dict[tuple[str, int, str], int] = {}
    for s in sorted(spans, key=lambda s: s.start):
        key = (s.role, s.rank, s.phase)
        i = last.get(key)
        if i is not None and s.start - bars[i].end <= gap:
            b = bars[i]
            bars[i] = Bar(b.role, b.rank, b.phase, b.start, max(b.end, s.end), min(b.first_step, s.step),
                          max(b.last_step, s.step))
        else:
            last[key] = len(bars)
            bars.append(Bar(s.role, s.rank, s.phase, s.start, s.end, s.step, s.step))
    return bars


def gantt_figure(spans: list[Span], t0: float | None = None):
    """One horizontal bar per (merged) span (x: seconds since ``t0``, by default the first span), one lane
    per worker, one colour per phase."""
    import plotly.graph_objects as go

    bars = merge_bars(spans)
    t0 = min(s.start for s in spans) if t0 is None else t0
    lanes = lanes_of(spans)
    labels = [lane_label(*lane) for lane in lanes]
    by_phase: dict[str, list[Bar]] = defaultdict(list)
    for b in bars:
        by_phase[b.phase].append(b)
    by_phase = dict(sorted(by_phase.items(), key=lambda item: _phase_order(item[0])))
    fig = go.Figure()
    extra = iter(_OTHER_COLORS * 8)
    for name, mine in by_phase.items():
        color = PHASE_COLORS.get(name) or next(extra, "#333333")
        fig.add_trace(go.Bar(
            orientation="h", name=html.escape(name), marker={"color": color, "line": {"width": 0}},
            y=[lane_label(b.role, b.rank) for b in mine], base=[round(b.start - t0, 4) for b in mine],
            x=[round(max(b.end - b.start, 1e-4), 4) for b in mine],
            customdata=[[b.steps, round(b.end - b.start, 4), round(b.start - t0, 4)] for b in mine],
            hovertemplate=(f"{html.escape(name)}<br>%{{y}}<br>step %{{customdata[0]}}<br>"
                           "start %{customdata[2]:.3f} s, duration %{customdata[1]:.3f} s<extra></extra>")))
    fig.update_layout(barmode="overlay", height=140 + 28 * len(lanes), template="plotly_white",
                      margin={"l": 90, "r": 10, "t": 30, "b": 40}, xaxis_title="seconds since the run's first span",
                      legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"}, bargap=0.25)
    fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(labels)), type="category")
    return fig


def idle_table(rows: list[RoleIdle], window: float, parts: int = 1) -> str:
    """An HTML table of each role's workers, busy seconds, idle fraction and seconds per phase."""
    phases = sorted({p for r in rows for p in r.phase_s}, key=_phase_order)
    head = "".join(f"<th>{html.escape(p)} (s)</th>" for p in phases)
    body = []
    for r in rows:
        cells = "".join(f"<td>{r.phase_s.get(p, 0.0):.2f}</td>" for p in phases)
        body.append(f"<tr><td>{html.escape(r.role)}</td><td>{r.workers}</td><td>{r.busy_s:.2f}</td>"
                    f"<td>{r.idle_fraction:.1%}</td>{cells}</tr>")
    split = (f" in {parts} sessions (the downtime between them, a resume or a recovery, is left out)"
             if parts > 1 else "")
    return (f"<p>Over the whole run: the recorded {window:.1f} s (first to last span){split}. Busy: the union of "
            "a worker's spans, averaged over the role's workers.</p>"
            "<table class='data' id='idle-table'><tr><th>role</th><th>workers</th><th>busy per worker (s)</th>"
            f"<th>idle fraction</th>{head}</tr>{''.join(body)}</table>")
