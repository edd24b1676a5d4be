"""Write per-step metrics to ``metrics.jsonl`` and hand them to the experiment trackers.

``metrics.jsonl`` is the source of truth; the trackers (``trackers.py``: TensorBoard, W&B, MLflow,
trackio) get every record, the resolved config once and text tables. On resume, records after the
checkpointed step are dropped from the JSONL file (they belong to steps that will run again) and
TensorBoard purges them too, so every step appears exactly once there (the other trackers continue their
run and show the repeated steps again). ``ledger.jsonl`` (``gyre.rollout.ledger``: what became of each
prompt drawn) is written, and truncated on resume, the same way. The logger never deletes files: a fresh
run gets a directory with no earlier run in it (``app/rundir.py``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gyre.tracking.trackers import TrackerError, TrackerRun, open_trackers

log = logging.getLogger(__name__)


class MetricsLogger:
    def __init__(self, output_dir: str | Path, trackers: TrackerRun | None = None, resume_step: int | None = None,
                 restart: bool = False, config: Mapping[str, Any] | None = None):
        """``trackers``: where else the records go (None: only metrics.jsonl). ``resume_step``: continue a
        run from that checkpointed step. ``restart``: the same run starts over from scratch after a fault
        before its first checkpoint (its own records are dropped). ``config``: the resolved config, logged
        once to the trackers."""
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        self.ledger_path = self.dir / "ledger.jsonl"
        if resume_step is not None or restart:
            for path in (self.path, self.ledger_path):
                truncate_after(path, BEFORE_EVERYTHING if restart else resume_step)
        self._ledger = None
        self.trackers = open_trackers(trackers, self.dir, resume_step, restart) if trackers else []
        self._failures: dict[int, int] = {}
        try:
            for tracker in self.trackers if config is not None else ():
                tracker.log_config(config)
        except Exception as exc:  # noqa: BLE001 - each library fails its own way; the message names it
            self.close()
            raise TrackerError(f"logging.trackers: {type(tracker).__name__} did not take the config "
                               f"({type(exc).__name__}: {exc}); remove it from logging.trackers to run without it") \
                from exc
        self._fh = self.path.open("a")

    def log(self, step: int, metrics: dict[str, float], phase: str = "train") -> None:
        record = {"step": step, "phase": phase, "time": round(time.time(), 3),
                  **{k: _clean(v) for k, v in metrics.items()}}
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()
        self._to_trackers(lambda tracker: tracker.log_metrics(step, metrics, phase))

    def ledger(self, line: Mapping[str, Any]) -> None:
        """A line of the trained-sample ledger (opened on the first: runs without a rollout write none)."""
        if self._ledger is None:
            self._ledger = self.ledger_path.open("a")
        self._ledger.write(json.dumps(line, separators=(",", ":")) + "\n")
        self._ledger.flush()

    def log_table(self, name: str, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """A text table (e.g. sample generations) to the trackers that show tables."""
        if rows:
            self._to_trackers(lambda tracker: tracker.log_table(name, step, rows))

    def _to_trackers(self, call) -> None:
        """A tracker that fails (its server out of reach, its disk full) never stops the run: metrics.jsonl
        has the record. The first failure warns; after MAX_TRACKER_FAILURES in a row the tracker is dropped."""
        for tracker in list(self.trackers):
            try:
                call(tracker)
                self._failures.pop(id(tracker), None)
            except Exception as exc:  # noqa: BLE001 - each library fails its own way
                failures = self._failures[id(tracker)] = self._failures.get(id(tracker), 0) + 1
                name = type(tracker).__name__
                if failures == 1:
                    log.warning("tracker %s failed (%s: %s); metrics.jsonl keeps every record", name,
                                type(exc).__name__, exc)
                if failures >= MAX_TRACKER_FAILURES:
                    log.warning("tracker %s failed %d times in a row: no more records go to it", name, failures)
                    self.trackers.remove(tracker)
                    _close_quietly(tracker)

    def close(self) -> None:
        """Close the file and every tracker, each on its own: one that fails to close does not keep the
        others (or the caller's clean-up) from running."""
        for fh in (getattr(self, "_fh", None), getattr(self, "_ledger", None)):
            if fh is not None:
                fh.close()
        for tracker in self.trackers:
            _close_quietly(tracker)


MAX_TRACKER_FAILURES = 3
"""Consecutive failed calls after which a tracker is dropped for the rest of the run."""


def _close_quietly(tracker) -> None:
    try:
        tracker.close()
    except Exception as exc:  # noqa: BLE001 - closing is best effort; the records are in metrics.jsonl
        log.warning("tracker %s did not close cleanly (%s: %s)", type(tracker).__name__, type(exc).__name__, exc)


BEFORE_EVERYTHING = -(1 << 62)
"""A resume step before every record: a restart from scratch drops them all."""


def truncate_after(path: Path, step: int) -> None:
    """Drop the records of a JSONL file whose step is after ``step`` (SFT warm-up records stay), atomically."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and _record_step(line) <= step]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


def _record_step(line: str) -> int:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:  # a line cut short by a kill: drop it
        return 1 << 62
    return int(record.get("step", 0)) if record.get("phase") != "sft" else -1


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_jsonl_tolerant(path: str | Path, limit: int | None = None) -> list[dict]:
    """The JSON objects of a JSONL file a run may still be writing (the report reads them): a line cut
    short by a kill, or one that is not an object, is skipped; at most ``limit`` objects."""
    rows: list[dict] = []
    for line in Path(path).read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
        if limit is not None and len(rows) >= limit:
            break
    return rows


def read_metrics(path: str | Path) -> list[dict]:
    out = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            out.append(json.loads(line))
    return out
