import json

import pytest

from gyre.tracking.logger import MetricsLogger, read_metrics
from gyre.tracking.plot import ema, plot_run, smoothing_weight
from gyre.tracking.trackers import TrackerRun


def test_resume_drops_records_after_the_checkpoint(tmp_path):
    log = MetricsLogger(tmp_path)
    log.log(3, {"loss": 0.5}, phase="sft")
    for step in range(1, 6):
        log.log(step, {"reward/mean": step / 10})
    log.close()
    with (tmp_path / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 6, "rew')  # a line cut short by SIGKILL
    resumed = MetricsLogger(tmp_path, resume_step=3)
    resumed.log(4, {"reward/mean": 0.44})
    resumed.close()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["phase"], r["step"]) for r in records] == [("sft", 3), ("train", 1), ("train", 2), ("train", 3),
                                                          ("train", 4)]
    assert records[-1]["reward/mean"] == 0.44


def test_logger_deletes_nothing_and_writes_tensorboard(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 9, "phase": "train"}) + "\n")
    (tmp_path / "tensorboard").mkdir()
    (tmp_path / "tensorboard" / "old_events").write_text("x")
    log = MetricsLogger(tmp_path, TrackerRun(("tensorboard",), "t"))
    log.log(1, {"reward/mean": 0.1, "nan_metric": float("nan")})
    log.log(1, {"sft_loss": 2.0}, phase="sft")
    log.close()
    records = read_metrics(tmp_path / "metrics.jsonl")
    # Keeping one run per directory is rundir's job; the logger only appends.
    assert [r["step"] for r in records] == [9, 1, 1] and records[1]["nan_metric"] is None
    assert (tmp_path / "tensorboard" / "old_events").read_text() == "x"
    assert any((tmp_path / "tensorboard" / "rl").iterdir()) and any((tmp_path / "tensorboard" / "sft").iterdir())


def test_plot_is_written(tmp_path):
    log = MetricsLogger(tmp_path)
    log.log(0, {"val/accuracy": 0.1, "val/reward/mean": 0.1})
    for step in range(1, 4):
        log.log(step, {"reward/mean": step / 4, "accuracy": step / 4})
    log.close()
    png = plot_run(tmp_path / "metrics.jsonl", tmp_path / "p.png", title="t")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_smoothing_is_a_debiased_ema():
    # w = 0.5: s1 = 0.5 * 1 = 0.5, / (1 - 0.5) = 1; s2 = 0.5 * 0.5 + 0.5 * 3 = 1.75, / (1 - 0.25) = 7/3.
    assert ema([1.0, 3.0], 0.5) == pytest.approx([1.0, 7 / 3])
    assert ema([2.0, 2.0, 2.0], 0.9) == pytest.approx([2.0, 2.0, 2.0])  # no pull towards 0 at the start
    assert smoothing_weight(5) == 0.0 and smoothing_weight(100) == pytest.approx(0.9)
