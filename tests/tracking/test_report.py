"""report.html from hand-written run directories (every section, edge cases, untrusted text kept inert),
the ``gyre report`` command, and what a real run writes: run_info.json, timeline.jsonl, report.html."""

import json
import re
import time

from gyre.app.cli import main
from gyre.tracking.report import SECTIONS, build_html, refresh_report, write_report
from gyre.tracking.report_curves import with_throughput
from gyre.tracking.timeline import read_spans, read_spans_counted
from tests.tracking.run_dirs import INJECTION, hand_written_run, long_run, write_jsonl


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


def test_the_page_opens_with_a_summary_of_the_run(tmp_path):
    """Status, steps and headline metrics first -> last, before any chart (the hand-written run: train
    rewards 0.1, 0.2, 0.3, one validation at step 0, no final model)."""
    page = build_html(hand_written_run(tmp_path))
    summary = page[page.index("<section id='summary'>"):page.index("<section id='curves'>")]
    assert page.index("<section id='summary'>") < page.index("<section id='curves'>")
    assert "no final model yet" in summary and "<th>steps</th><td>3 (train)</td>" in summary
    assert "<th>train reward</th><td>0.100 → 0.300</td>" in summary
    assert "<th>train accuracy</th><td>10.0% → 30.0%</td>" in summary
    assert "<th>held-out accuracy</th><td>10.0%</td>" in summary and "SFT loss" not in summary
    (tmp_path / "final_model").mkdir()
    assert "finished: final_model/ written" in build_html(tmp_path)


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
    # The page goes through a temporary file of its own: a user's r.tmp beside --out is left alone.
    (tmp_path / "r.tmp").write_text("mine")
    assert main(["report", str(run), "--out", str(tmp_path / "r.html")]) == 0
    assert (tmp_path / "r.tmp").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "r.tmp", "run"]
    warned = []
    assert refresh_report(tmp_path / "missing" / "dir", warned.append) is None
    assert warned and warned[0].startswith("warning: report.html was not written")


def test_a_long_run_gets_a_bounded_page_written_in_seconds(tmp_path):
    run = long_run(tmp_path)  # 2000 steps of 50 spans: 100,000 spans
    start = time.perf_counter()
    page = write_report(run).read_text()
    assert time.perf_counter() - start < 15  # about 1.5 s unloaded; every span drawn took minutes and 40 MB
    assert len(page.encode()) < 8_000_000  # plotly.js is 4.6 MB of it
    assert "The chart shows steps 1981 to 2000, the last 20 of 2000" in page
    assert page.count("class='gen-step'") == 20 + 10
    assert "Showing the last 20 train and 10 validation steps of the 42 files" in page


def test_throughput_counts_trained_samples_and_their_sampled_tokens():
    records = with_throughput([{"step": 1, "time/step": 2.0, "batch/samples": 8, "batch/response_tokens": 40,
                                "batch/rows": 16},
                               {"step": 2, "time/step": 2.0, "batch/rows": 16}])  # a run from before the counts
    assert (records[0]["throughput/samples_per_s"], records[0]["throughput/tokens_per_s"]) == (4.0, 20.0)
    assert not any(k.startswith("throughput/") for k in records[1])


def test_a_malformed_timeline_is_skipped_line_by_line_and_roles_are_escaped(tmp_path):
    good = {"role": "<b>judge</b>", "rank": 0, "phase": "reward", "start": 1.0, "end": 2.0, "step": 1}
    write_jsonl(tmp_path / "timeline.jsonl", [good, {**good, "start": "soon"}, {**good, "rank": None},
                                              {**good, "extra": 1}, {**good, "end": 0.5}])
    with (tmp_path / "timeline.jsonl").open("a") as fh:
        fh.write('[1, 2]\n{"role": "pol\n')
    spans, skipped = read_spans_counted(tmp_path / "timeline.jsonl")
    assert spans == read_spans(tmp_path / "timeline.jsonl") and len(spans) == 1 and skipped == 6
    page = build_html(tmp_path)
    assert "6 line(s) of timeline.jsonl are not spans and were skipped" in page and "timeline-chart" in page
    assert "<b>judge</b>" not in page and "&lt;b&gt;judge&lt;" in page


def test_a_dpo_run_gets_its_charts(tmp_path):
    write_jsonl(tmp_path / "metrics.jsonl", [
        {"step": n, "phase": "dpo", "dpo_loss": 0.69 - 0.1 * n, "rewards/accuracies": 0.5 + 0.1 * n,
         "rewards/margins": 0.1 * n, "rewards/chosen": 0.1, "rewards/rejected": -0.1, "time/step": 1.0}
        for n in (1, 2, 3)])
    page = build_html(tmp_path)
    assert "No metrics yet" not in page
    for title in ("DPO loss", "DPO preference accuracy", "DPO implicit rewards", "DPO step"):
        assert title in page
    assert "rewards\\u002faccuracies" in page and "rewards\\u002fmargins" in page


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
    # Throughput counts: 2 prompts x 2 samples trained per step, each of 1 to 3 sampled tokens.
    records = [json.loads(line) for line in (trained_run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "batch/samples" in r]
    assert len(steps) == 2 and all(r["batch/samples"] == 4 and 4 <= r["batch/response_tokens"] <= 12 for r in steps)
