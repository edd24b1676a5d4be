"""report.html from hand-written run directories (every section, edge cases, untrusted text kept inert),
the ``gyre report`` command, and what a real run writes: run_info.json, timeline.jsonl, report.html."""

import json
import re

from gyre.cli import main
from gyre.tracking.report import SECTIONS, build_html, refresh_report, write_report
from gyre.tracking.timeline import read_spans
from tests.tracking.run_dirs import INJECTION, hand_written_run


def test_every_section_is_written_and_untrusted_text_stays_text(tmp_path):
    page = write_report(hand_written_run(tmp_path)).read_text()
    for sid, _ in SECTIONS:
        assert f"<section id='{sid}'>" in page
    assert "alert(1)" in page and INJECTION not in page and "<b>not bold</b>" not in page
    # Scripts: plotly.js, one per figure, the step selector; none from a generation or the config.
    figures = len(re.findall(r"<div id=\"(curve-\d+|timeline-chart)\"", page))
    assert page.count("<script") == 1 + figures + 1
    # Per-domain accuracy in the accuracy panel (plotly's JSON writes "/" as \u002f).
    assert "math\\u002faccuracy" in page and "code\\u002faccuracy" in page
    assert page.count("class='gen-step'") == 3 and page.count(" hidden>") == 2  # the last step shown
    assert "idle-table" in page and "2 turns" in page


def test_an_empty_run_dir_still_gets_a_page_that_says_what_is_missing(tmp_path):
    page = build_html(tmp_path)
    assert "No metrics yet" in page and "No phase spans recorded" in page and "generations/</code> is absent" in page
    assert "run_info.json is absent" in page and "validation.md is absent" in page


def test_report_command_and_a_failed_refresh_only_warns(tmp_path, capsys):
    run = hand_written_run(tmp_path / "run")
    assert main(["report", str(run), "--out", str(tmp_path / "r.html")]) == 0
    assert (tmp_path / "r.html").exists() and "wrote" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    assert "holds no run" in capsys.readouterr().err
    warned = []
    assert refresh_report(tmp_path / "missing" / "dir", warned.append) is None
    assert warned and warned[0].startswith("warning: report.html was not written")


def test_a_real_run_records_every_workers_phases(trained_run):
    spans = read_spans(trained_run / "timeline.jsonl")
    lanes = {(s.role, s.rank) for s in spans}
    assert lanes == {("driver", 0), ("policy", 0), ("policy", 1), ("rollout", 0), ("reward", 0)}
    phases = {(s.role, s.phase) for s in spans}
    assert {("rollout", "generate"), ("rollout", "weight_sync"), ("reward", "reward"), ("policy", "train"),
            ("policy", "weight_sync"), ("policy", "checkpoint"), ("driver", "validate"),
            ("driver", "checkpoint")} <= phases
    assert {s.step for s in spans} == {0, 1, 2} and all(s.end >= s.start for s in spans)
    info = json.loads((trained_run / "run_info.json").read_text())
    assert set(info) == {"gyre", "torch", "transformers", "ray", "python", "git_commit", "placement", "started"}
    assert info["placement"].startswith("placement: ") and "policy" in info["placement"]
    # The report was written at the end of the run (logging.report defaults to on).
    assert "timeline-chart" in (trained_run / "report.html").read_text()
