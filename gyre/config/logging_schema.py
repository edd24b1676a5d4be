"""The ``logging`` sections: which experiment trackers a run writes to, and what else it logs.

``metrics.jsonl`` in the run directory is always written and is the source of truth; the trackers
(``gyre.tracking.trackers``) get the same records. Each tracker's library is an optional dependency
(``pip install 'gyre[trackers]'``): selecting one whose library is missing is a config error, found
without importing it.
"""

from __future__ import annotations

import importlib.util
from typing import Literal

from pydantic import field_validator

from gyre.config.base import NonNegInt, PositiveInt, StrictModel

TrackerName = Literal["tensorboard", "wandb", "mlflow", "trackio"]

TRACKER_MODULES: dict[str, str] = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow",
                                   "trackio": "trackio"}
"""The module each tracker imports (checked at config time, imported only when the run starts)."""


class TrackingFields(StrictModel):
    """The tracker keys every pipeline's ``logging`` section has."""

    trackers: list[TrackerName] = ["tensorboard"]
    """Experiment trackers that receive the metrics, the resolved config (once) and the generation tables:
    any of tensorboard (run.output_dir/tensorboard), wandb (offline by default: run.output_dir/wandb),
    mlflow (a local store in run.output_dir/mlflow by default) and trackio (its database in
    run.output_dir/trackio unless TRACKIO_DIR is set). [] writes only metrics.jsonl. TRL's report_to."""
    project: str = "gyre"
    """The W&B project, MLflow experiment and trackio project the run is logged under (the run's name in
    them is run.name)."""
    wandb_mode: Literal["offline", "online"] = "offline"
    """offline: W&B writes run.output_dir/wandb only (upload later with ``wandb sync``); online: it streams
    to the W&B server (needs a login)."""
    mlflow_tracking_uri: str | None = None
    """Where MLflow logs (a server's http(s) URI, or a database URI). None: a local file store in
    run.output_dir/mlflow (open it with ``mlflow ui --backend-store-uri file:<that directory>``)."""

    report: bool = True
    """Write report.html, one self-contained page (curves, a phase timeline per worker, sample generations,
    the config and placement), at the end of the run (an RL run also refreshes it at validations, at most
    once a minute); ``gyre report RUN_DIR`` writes it for any run directory. A failure to write it only warns."""

    @field_validator("trackers")
    @classmethod
    def _installed(cls, trackers: list[str]) -> list[str]:
        if len(set(trackers)) != len(trackers):
            raise ValueError(f"logging.trackers lists a tracker twice: {trackers}")
        missing = [name for name in trackers if importlib.util.find_spec(TRACKER_MODULES[name]) is None]
        if missing:
            raise ValueError(
                f"logging.trackers selects {', '.join(missing)}, whose library is not installed. Install the "
                "trackers with pip install 'gyre[trackers]', or remove it from logging.trackers.")
        return trackers


class LoggingConfig(TrackingFields):
    """Trackers, generation samples, the metrics plot and the progress line of an RL run."""

    generations_every: NonNegInt = 10
    """Every this many steps (and at the last), a sample of the step's train generations goes to
    run.output_dir/generations/step_<N>.jsonl and to the trackers' tables; every validation writes a sample
    of its generations to generations/val_step_<N>.jsonl. 0: no generations are written."""
    generations_samples: PositiveInt = 8
    """Generations in each sample: spread over the groups, with high and low rewards."""
    plot: bool = True
    """Write a PNG of the main metrics (metrics.png) at the end of the run."""
    progress: bool = True
    """Print a progress line per step."""


class SFTLoggingSection(TrackingFields):
    """Trackers and the progress line of a standalone trainer run (gyre sft, gyre dpo)."""

    progress: bool = True
    """Print a progress line per step."""
