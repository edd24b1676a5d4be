"""``RUN_DIR/report.html``: one self-contained page about a run, readable offline.

Sections: curves (``report_curves``), the phase timeline per worker with each role's idle fraction
(``report_timeline``), sample generations, the validation table, versions and the placement plan, and the
resolved config (``report_sections``). plotly.js is inlined once; a Content-Security-Policy forbids
every fetch, so the page never touches the network. Written by ``gyre report RUN_DIR``, at the end of
every run and at each validation (``logging.report``); a failure there warns and never stops a run.
"""

from __future__ import annotations

import html
import logging
import os
import tempfile
from pathlib import Path

from gyre.tracking.report_sections import (
    config_section,
    generations_section,
    run_section,
    summary_section,
    validation_section,
)

log = logging.getLogger(__name__)

REPORT = "report.html"
SECTIONS = (("summary", "Summary"), ("curves", "Curves"), ("timeline", "Phase timeline"),
            ("generations", "Generations"), ("validation", "Validation"), ("run", "Run, versions and placement"),
            ("config", "Resolved config"))
"""(id, title) of the page's sections, in order."""
_CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "img-src data: blob:; font-src data:")
_STYLE = """
body{font-family:system-ui,sans-serif;margin:0;color:#222}
nav{position:sticky;top:0;background:#1f2937;padding:8px 16px;z-index:10}
nav a{color:#e5e7eb;margin-right:16px;text-decoration:none}
main{padding:0 16px 32px}
h1{font-size:1.4em}
section{margin-top:24px}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(440px,1fr));gap:8px}
.note{color:#666;font-style:italic}
table.data{border-collapse:collapse;margin:8px 0}
table.data td,table.data th{border:1px solid #ddd;padding:3px 8px;text-align:left;font-size:0.9em}
pre{white-space:pre-wrap;word-break:break-word;background:#f6f8fa;padding:6px;margin:2px 0;max-height:24em;
overflow:auto}
.card{border:1px solid #ddd;border-radius:6px;padding:8px;margin:8px 0}
.fact{margin-right:12px;font-size:0.9em}
.label{font-size:0.8em;color:#666;margin-top:6px}
"""


def curves_html(run_dir: Path) -> str:
    from gyre.tracking.logger import read_jsonl_tolerant
    from gyre.tracking.report_curves import curve_figures

    path = run_dir / "metrics.jsonl"
    records = read_jsonl_tolerant(path) if path.exists() else []
    figures = curve_figures(records)
    if not figures:
        return "<p class='note'>No metrics yet (metrics.jsonl is absent or empty).</p>"
    return "<div class='grid'>" + "".join(_figure(f, f"curve-{i}") for i, f in enumerate(figures)) + "</div>"


def timeline_html(run_dir: Path) -> str:
    from gyre.tracking.report_timeline import gantt_figure, gantt_window, idle_by_role, idle_table, sessions
    from gyre.tracking.timeline import read_spans_counted

    path = run_dir / "timeline.jsonl"
    spans, skipped = read_spans_counted(path) if path.exists() else ([], 0)
    bad = (f"<p class='note'>{skipped} line(s) of timeline.jsonl are not spans and were skipped.</p>"
           if skipped else "")
    if not spans:
        return bad + "<p class='note'>No phase spans recorded (timeline.jsonl is absent or empty).</p>"
    shown, first, last = gantt_window(spans)
    steps = len({s.step for s in spans})
    scope = (f"<p class='note'>The chart shows steps {first} to {last}, the last {len({s.step for s in shown})} of "
             f"{steps}; the idle table below covers the whole run.</p>" if len(shown) < len(spans) else "")
    rows, window = idle_by_role(spans)
    parts = len(sessions([s for s in spans if s.role != "driver"]))
    t0 = min(s.start for s in spans)
    return bad + scope + _figure(gantt_figure(shown, t0), "timeline-chart") + idle_table(rows, window, parts)


def build_html(run_dir: str | Path) -> str:
    """The report page of the run in ``run_dir``."""
    from plotly.offline import get_plotlyjs

    run_dir = Path(run_dir)
    bodies = {"summary": summary_section, "curves": curves_html, "timeline": timeline_html,
              "generations": generations_section, "validation": validation_section, "run": run_section,
              "config": config_section}
    nav = "".join(f"<a href='#{sid}'>{title}</a>" for sid, title in SECTIONS)
    sections = "".join(f"<section id='{sid}'><h2>{title}</h2>{bodies[sid](run_dir)}</section>"
                       for sid, title in SECTIONS)
    title = html.escape(f"gyre run report: {run_dir.resolve().name}")
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<meta http-equiv='Content-Security-Policy' content=\"{_CSP}\"><title>{title}</title>"
            f"<style>{_STYLE}</style><script>{get_plotlyjs()}</script></head>"
            f"<body><nav>{nav}</nav><main><h1>{title}</h1>{sections}</main></body></html>")


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the report (atomically: a reader never sees half a page); returns its path. The page is written
    to a temporary file of its own beside the target (a running run and ``gyre report`` may write at once)."""
    run_dir = Path(run_dir)
    target = Path(out) if out is not None else run_dir / REPORT
    page = build_html(run_dir)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(page)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the page from others who may read the run
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def refresh_report(run_dir: str | Path, echo=None) -> Path | None:
    """``write_report`` for a running or finished run: a failure warns (via ``echo`` or the log) and returns None."""
    try:
        return write_report(run_dir)
    except Exception as exc:  # noqa: BLE001 - the report is a view of the run; it must never stop it
        message = f"warning: report.html was not written ({type(exc).__name__}: {exc})"
        (echo or log.warning)(message)
        return None


def _figure(fig, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})
