"""driver.log: held messages, a line per step, gyre's warnings, and the traceback of a fatal error."""

import logging

from gyre.tracking.driver_log import DriverLog
from gyre.tracking.progress import Progress


def test_messages_before_the_run_dir_is_known_are_kept(tmp_path):
    shown = []
    log = DriverLog(shown.append)
    log.echo("data: 8 training prompts")  # pre-flight: the directory is not decided yet
    log.attach(tmp_path, resumed=False)
    log.echo("placement: policy on cpu")
    progress = Progress(3, enabled=False)
    progress.update(1, {"reward/mean": 0.5, "accuracy": 0.25})
    logging.getLogger("gyre.rollout.driver").warning("an engine was replaced")
    logging.getLogger("gyre.rollout.driver").info("below the warning level: not kept")
    try:
        raise ValueError("bad row")
    except ValueError as exc:
        log.error(exc)
    log.close()
    text = (tmp_path / "driver.log").read_text()
    assert shown == ["data: 8 training prompts", "placement: policy on cpu"]  # the terminal sees them once
    order = [text.index(s) for s in ("==== started", "data: 8 training", "placement:", "step 1/3 reward=0.500 acc=0.25",
                                     "an engine was replaced", "ValueError: bad row")]
    assert order == sorted(order)
    assert "not kept" not in text and "Traceback" in text
    assert logging.getLogger("gyre.progress").propagate  # the loggers are as they were before the run
    # After close nothing more is written, and a resumed run appends under a line that says so.
    Progress(3, enabled=False).update(2, {})
    log = DriverLog(lambda m: None)
    log.attach(tmp_path, resumed=True)
    log.close()
    text = (tmp_path / "driver.log").read_text()
    assert "step 2/3" not in text and text.index("==== resumed") > text.index("bad row")


def test_the_progress_line_shows_trained_tokens_per_second_and_the_wasted_share():
    from gyre.tracking.progress import _summary

    line = _summary({"reward/mean": 0.5, "time/step": 2.0, "rollout/tokens_trained": 1000,
                     "rollout/tokens_wasted_share": 0.125})
    assert line == "reward=0.500 s/step=2.00 tok/s=500 wasted=12%"
