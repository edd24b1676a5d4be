"""Experiment trackers behind one small interface: TensorBoard, Weights & Biases, MLflow, trackio.

``MetricsLogger`` writes ``metrics.jsonl`` (the source of truth) and hands every record to the trackers
the config selects (``logging.trackers``). Each tracker imports its library only when it is opened, and
keeps its files inside the run directory by default: W&B offline in ``wandb/``, MLflow's file store in
``mlflow/``, trackio's database in ``trackio/`` and TensorBoard's events in ``tensorboard/rl`` and
``tensorboard/sft`` (the SFT warm-up has a step axis of its own). A resumed run continues the same
tracker run where the library allows it (by gyre's run id, or by run name for trackio).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class TrackerRun:
    """Which trackers a run writes to, and under what names (from the config's ``logging`` section)."""

    trackers: tuple[str, ...]
    """The selected trackers (logging.trackers)."""
    name: str
    """The run's name in every tracker (run.name)."""
    run_id: str | None = None
    """gyre's run id (run.json): a resumed run finds its W&B and MLflow run by it. None: a new id."""
    project: str = "gyre"
    """W&B project, MLflow experiment, trackio project."""
    wandb_mode: str = "offline"
    mlflow_tracking_uri: str | None = None
    """None: a local file store in the run directory."""

    @classmethod
    def from_config(cls, logging, name: str, run_id: str | None) -> TrackerRun:
        """From a ``logging`` section (LoggingConfig or SFTLoggingSection)."""
        return cls(tuple(logging.trackers), name, run_id, logging.project, logging.wandb_mode,
                   logging.mlflow_tracking_uri)

    def describe(self, out: Path) -> str:
        """One line for the start of a run: where each tracker writes and how to look at it."""
        where = {"tensorboard": f"tensorboard --logdir {out / 'tensorboard'}",
                 "wandb": f"W&B project {self.project}, " + (
                     f"offline in {out / 'wandb'} (upload: wandb sync {out / 'wandb'}/offline-run-*; "
                     "each resumed session is a W&B run of its own, grouped under the run id)"
                     if self.wandb_mode == "offline" else "online"),
                 "mlflow": f"MLflow experiment {self.project} at {mlflow_uri(self, out)}",
                 "trackio": f"trackio project {self.project} in {trackio_dir(out)} "
                            f"(TRACKIO_DIR={trackio_dir(out)} trackio show --project {self.project})"}
        shown = "; ".join(where[name] for name in self.trackers)
        return f"metrics: {out / 'metrics.jsonl'}" + (f"; trackers: {shown}" if shown else "")


class Tracker(Protocol):
    """What the metrics logger needs of a tracker."""

    def log_config(self, config: Mapping[str, Any]) -> None:
        """The resolved config (nested), once at the start."""

    def log_metrics(self, step: int, metrics: Mapping[str, float], phase: str) -> None:
        """Finite numbers only. ``phase``: train (RL), sft (its own step axis) or dpo."""

    def log_table(self, name: str, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """A text table (rows with the same keys), e.g. sample generations."""

    def close(self) -> None:
        """Flush and finish the tracker run."""


def open_trackers(run: TrackerRun, out: Path, resume_step: int | None, restart: bool) -> list[Tracker]:
    """The selected trackers, each continuing its earlier run when ``resume_step`` (a checkpointed step)
    or ``restart`` (the same run again after a fault before its first checkpoint) says so."""
    opened: list[Tracker] = []
    try:
        for name in run.trackers:
            opened.append(_open(name, run, out, resume_step, restart))
    except BaseException:
        for tracker in opened:
            tracker.close()
        raise
    return opened


class TrackerError(RuntimeError):
    """A selected tracker could not start (not logged in, a server out of reach)."""


_HINTS = {"wandb": "with logging.wandb_mode=online, log in first (wandb login, or WANDB_API_KEY), or use "
                   "logging.wandb_mode=offline and upload later with wandb sync",
          "mlflow": "check logging.mlflow_tracking_uri (null: a local store in the run directory)",
          "trackio": "check TRACKIO_DIR, or leave it unset (the run directory's trackio/ is used)",
          "tensorboard": "check that the run directory is writable"}


def _open(name: str, run: TrackerRun, out: Path, resume_step: int | None, restart: bool) -> Tracker:
    makers = {"wandb": WandbTracker, "mlflow": MlflowTracker, "trackio": TrackioTracker}
    try:
        if name == "tensorboard":
            return TensorBoardTracker(out, resume_step, restart)
        return makers[name](run, out, resume_step is not None or restart)
    except Exception as exc:  # noqa: BLE001 - each library fails its own way; the message names it
        raise TrackerError(f"logging.trackers: {name} could not start ({type(exc).__name__}: {exc}). "
                           f"{_HINTS[name].capitalize()}; or remove {name} from logging.trackers.") from exc


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists and None stay values."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


def phase_keys(metrics: Mapping[str, float], phase: str) -> dict[str, float]:
    """Finite numbers of ``metrics``; SFT steps' keys under sft/ (an RL run's warm-up shares the tracker
    run with it, and its losses are not the RL losses)."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[key if phase != "sft" or key.startswith("sft/") else f"sft/{key}"] = float(value)
    return out


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    columns = list(rows[0]) if rows else []
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in cells])


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _cell(value: Any) -> str:
    return _text(value).replace("|", "\\|").replace("\n", "<br>")


def _table_values(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """(columns, data); nested values (multi-turn turns) as JSON text, which every table shows."""
    columns = list(rows[0]) if rows else []
    return columns, [[v if v is None or isinstance(v, (str, int, float)) else json.dumps(v)
                      for v in (row.get(c) for c in columns)] for row in rows]


class TensorBoardTracker:
    """Scalars in tensorboard/rl (SFT steps: tensorboard/sft); a resume purges the steps it runs again."""

    def __init__(self, out: Path, resume_step: int | None, restart: bool):
        from torch.utils.tensorboard import SummaryWriter

        self._writer_cls, self._dir = SummaryWriter, out / "tensorboard"
        self._resumed = resume_step is not None and not restart
        purge = None if resume_step is None and not restart else (0 if restart else resume_step + 1)
        self._sft_purge = 0 if restart else None
        self._rl = SummaryWriter(str(self._dir / "rl"), purge_step=purge)
        self._sft = None

    def log_config(self, config: Mapping[str, Any]) -> None:
        if not self._resumed:  # a resumed run's config text is already there
            self._rl.add_text("config", "```\n" + json.dumps(config, indent=1) + "\n```", 0)

    def log_metrics(self, step: int, metrics: Mapping[str, float], phase: str) -> None:
        writer = self._writer(phase)
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                writer.add_scalar(key, value, step)

    def _writer(self, phase: str):
        if phase != "sft":
            return self._rl
        if self._sft is None:
            self._sft = self._writer_cls(str(self._dir / "sft"), purge_step=self._sft_purge)
        return self._sft

    def log_table(self, name: str, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        self._rl.add_text(name, markdown_table(rows), step)

    def close(self) -> None:
        for writer in (self._rl, self._sft):
            if writer is not None:
                writer.close()


def wandb_session_id(run_id: str, out: Path, mode: str, resumed: bool) -> str:
    """The W&B run id of this session. Online, a resumed run continues gyre's run id. Offline, W&B cannot
    resume: ``wandb sync`` of a second offline directory with the same id replaces the first one's
    history, so each later session is a W&B run of its own (``<run id>-r<k>``), in the group ``<run id>``."""
    if mode != "offline" or not resumed:
        return run_id
    earlier = len(list((out / "wandb").glob(f"offline-run-*-{run_id}*")))
    return run_id if earlier == 0 else f"{run_id}-r{earlier}"


class WandbTracker:
    """A W&B run with gyre's run id (offline by default: files in run_dir/wandb, ``wandb sync`` uploads
    them; an offline resume is a new W&B run in the same group, see ``wandb_session_id``). Each metric is
    plotted over its own step key (step, or sft/step), so a resumed run's repeated steps and the warm-up's
    separate axis never meet W&B's rule that its internal step only grows."""

    def __init__(self, run: TrackerRun, out: Path, resumed: bool):
        import wandb

        self._wandb = wandb
        settings = wandb.Settings(silent=True, console="off", disable_git=True, x_disable_stats=True)
        run_id = run.run_id or uuid.uuid4().hex[:12]
        self._run = wandb.init(project=run.project, name=run.name, id=wandb_session_id(run_id, out, run.wandb_mode,
                                                                                        resumed),
                               group=run_id, dir=str(out), mode=run.wandb_mode, resume="allow", settings=settings)
        self._defined: set[str] = set()

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._run.config.update(dict(config), allow_val_change=True)

    def log_metrics(self, step: int, metrics: Mapping[str, float], phase: str) -> None:
        axis = "sft/step" if phase == "sft" else "step"
        values = phase_keys(metrics, phase)
        self._define(values, axis)
        self._run.log({**values, axis: step})

    def _define(self, keys, axis: str) -> None:
        for key in keys:
            if key not in self._defined:
                self._run.define_metric(key, step_metric=axis)
                self._defined.add(key)

    def log_table(self, name: str, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        columns, data = _table_values(rows)
        self._define([name], "step")
        self._run.log({name: self._wandb.Table(columns=columns, data=data), "step": step})

    def close(self) -> None:
        self._run.finish()
        # End W&B's service process too: a run reopened in this process (in-run recovery) with the same id
        # while the old service still holds it can write nothing (seen with wandb 0.31 offline).
        self._wandb.teardown()


_MLFLOW_KEY = re.compile(r"[^\w\-. /]")
_MLFLOW_PARAMS_PER_CALL = 100
_MLFLOW_PARAM_CHARS = 6000


class MlflowTracker:
    """An MLflow run in experiment ``project``, tagged with gyre's run id (a resume continues it). The
    default store is a local file store in run_dir/mlflow: mlflow-skinny has no database backend without
    SQLAlchemy, and MLflow 3 refuses file stores unless MLFLOW_ALLOW_FILE_STORE is set (set here when the
    store is a file store, which the config chose). Tables are JSON artifacts ({"columns", "data"}: what
    log_table writes, without needing pandas)."""

    def __init__(self, run: TrackerRun, out: Path, resumed: bool):
        uri = mlflow_uri(run, out)
        if uri.startswith("file:") or "://" not in uri:  # a file store, chosen on purpose: MLflow 3 wants consent
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow import MlflowClient

        self._client = client = MlflowClient(tracking_uri=uri)
        self.uri = uri
        experiment = client.get_experiment_by_name(run.project)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(run.project)
        run_id = run.run_id or uuid.uuid4().hex[:12]
        found = client.search_runs([experiment_id], f"tags.`gyre.run_id` = '{run_id}'", max_results=1) if resumed \
            else []
        self._resumed = bool(found)
        if found:
            self.run_id = found[0].info.run_id
            client.update_run(self.run_id, status="RUNNING")
        else:
            self.run_id = client.create_run(experiment_id, run_name=run.name, tags={"gyre.run_id": run_id}).info.run_id

    def log_config(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        self._client.log_dict(self.run_id, dict(config), "resolved_config.json")
        if self._resumed:  # parameters are immutable in MLflow; the resumed run logged them at its start
            return
        flat = flatten(config)
        params = [Param(_MLFLOW_KEY.sub("_", k)[:250], _text(v)[:_MLFLOW_PARAM_CHARS]) for k, v in flat.items()]
        for i in range(0, len(params), _MLFLOW_PARAMS_PER_CALL):
            self._client.log_batch(self.run_id, params=params[i:i + _MLFLOW_PARAMS_PER_CALL])

    def log_metrics(self, step: int, metrics: Mapping[str, float], phase: str) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(_MLFLOW_KEY.sub("_", k), v, now, step) for k, v in phase_keys(metrics, phase).items()]
        if batch:
            self._client.log_batch(self.run_id, metrics=batch)

    def log_table(self, name: str, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        columns, data = _table_values(rows)
        self._client.log_dict(self.run_id, {"columns": columns, "data": data}, f"{name}/step_{step}.json")

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


def mlflow_uri(run: TrackerRun, out: Path) -> str:
    """logging.mlflow_tracking_uri, else the run directory's own file store."""
    return run.mlflow_tracking_uri or (out / "mlflow").resolve().as_uri()


def trackio_dir(out: Path) -> str:
    """Where trackio keeps its database: TRACKIO_DIR when the user set it, else run_dir/trackio."""
    return os.environ.get("TRACKIO_DIR") or str((out / "trackio").resolve())


class TrackioTracker:
    """A trackio run named run.name in project ``project``. trackio reads its data directory from
    TRACKIO_DIR once, when it is first imported: gyre points it at run_dir/trackio unless the user set
    TRACKIO_DIR (or trackio was imported earlier in this process, which keeps the directory it chose)."""

    def __init__(self, run: TrackerRun, out: Path, resumed: bool):
        if "trackio" not in sys.modules:
            os.environ["TRACKIO_DIR"] = trackio_dir(out)
        import trackio

        self._trackio, self._run_info = trackio, run
        self._resumed = resumed
        self._run = None

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._start(flatten(config))

    def _start(self, config: dict | None) -> Any:
        """trackio takes the config only when a run starts, so the run starts at the first record."""
        if self._run is None:
            r = self._run_info
            self._run = self._trackio.init(project=r.project, name=r.name, config=config,
                                           resume="allow" if self._resumed else "never", embed=False,
                                           auto_log_gpu=False, auto_log_cpu=False)
        return self._run

    def log_metrics(self, step: int, metrics: Mapping[str, float], phase: str) -> None:
        self._start(None).log(phase_keys(metrics, phase), step=step)

    def log_table(self, name: str, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        columns, data = _table_values(rows)
        self._start(None).log({name: self._trackio.Table(columns=columns, data=data)}, step=step)

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
