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


class _BrokenTracker:
    """A tracker whose library fails on every call (a server gone, a disk full): the logger's view of it."""

    def __init__(self):
        self.calls, self.closed = 0, False

    def log_config(self, config):
        raise ConnectionError("server gone")

    def log_metrics(self, step, metrics, phase):
        self.calls += 1
        raise ConnectionError("server gone")

    def log_table(self, name, step, rows):
        raise ConnectionError("server gone")

    def close(self):
        self.closed = True
        raise ConnectionError("server gone")


def test_a_failing_tracker_is_warned_about_then_dropped_and_never_stops_the_run(tmp_path, caplog):
    log = MetricsLogger(tmp_path)
    broken = _BrokenTracker()
    log.trackers.append(broken)
    with caplog.at_level("WARNING", logger="gyre.tracking.logger"):
        for step in range(1, 6):
            log.log(step, {"reward/mean": step / 10})
    log.close()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4, 5]  # nothing lost
    assert broken.calls == 3 and broken.closed and log.trackers == []  # dropped after 3 failures in a row
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 3 and "ConnectionError: server gone" in warnings[0] and "3 times" in warnings[1]


def test_a_tracker_that_refuses_the_config_is_a_tracker_error(tmp_path, monkeypatch):
    from gyre.tracking import logger as logger_module
    from gyre.tracking.trackers import TrackerError

    broken = _BrokenTracker()
    monkeypatch.setattr(logger_module, "open_trackers", lambda *a: [broken])
    with pytest.raises(TrackerError, match="did not take the config .*remove it from logging.trackers"):
        MetricsLogger(tmp_path, TrackerRun(("tensorboard",), "n"), config={"a": 1})
    assert broken.closed  # closed again before the error leaves
