"""One run per output directory: decide once whether a run starts fresh, resumes, or sets an earlier
run aside, and never delete or mix runs.

A fresh start writes ``run.json`` with a new run id; every checkpoint records the id of the run that
wrote it, and resuming a checkpoint of another run is refused. A fresh run into a directory that
already holds a run is refused unless the caller says what to do with it: resume it, or move its
files aside to a sibling directory ``<dir>.old-<time>`` (nothing is ever deleted). Files gyre did not
write (the quickstart's model/ and data/, a user's notes) stay where they are.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

from gyre.models.hub import HubPin
from gyre.training.checkpoint import CheckpointManager, ResumeError

RunMode = Literal["fresh", "resume", "auto", "overwrite"]
"""fresh: refuse a directory that holds a run; resume: continue its latest checkpoint (one must exist);
auto: resume when a checkpoint exists, else start fresh (an earlier run's files are set aside);
overwrite: set an earlier run's files aside and start fresh."""

RUN_FILES = ("run.json", "run_info.json", "resolved_config.yaml", "driver.log", "metrics.jsonl", "metrics.tmp",
             "timeline.jsonl", "timeline.tmp", "generations", "tensorboard", "wandb", "mlflow", "trackio",
             "checkpoints", "final_model", "validation.md", "metrics.png", "report.html", "report.tmp",
             "reward_accuracy.png")  # the plot's earlier name: older runs are still recognised
"""Everything a run writes into its output directory."""


class RunDirError(ValueError):
    """The output directory holds a run that this start would destroy or mix with."""


@dataclass(frozen=True)
class RunStart:
    """How a run begins in its output directory (decided before Ray starts)."""

    output_dir: Path
    run_id: str
    checkpoint: Path | None = None
    """The checkpoint to continue from; None starts from scratch."""
    set_aside: tuple[Path, ...] = ()
    """An earlier run's files, moved to a sibling directory before this run starts."""
    why: str = ""
    """Why they are set aside, for the message."""


def run_artifacts(out: Path, names: Iterable[str] = RUN_FILES) -> list[Path]:
    """The run files present in ``out``: any of them means the directory holds a run."""
    return [out / name for name in names if (out / name).exists()]


def read_run_id(out: Path) -> str | None:
    try:
        return str(json.loads((out / "run.json").read_text())["run_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_hub_pins(out: Path) -> dict[str, HubPin]:
    """What each model key's Hub id resolved to when the run in ``out`` started (run.json's hub_models);
    empty for a run of local model directories, or one recorded before gyre kept this."""
    try:
        record = json.loads((out / "run.json").read_text()).get("hub_models") or {}
        return {key: HubPin(str(pin["repo_id"]), pin.get("revision"), str(pin["commit"]))
                for key, pin in record.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def decide_start(out: Path, mode: RunMode) -> RunStart:
    """Fresh, resume or set aside, for ``mode``; raises RunDirError / ResumeError when the directory
    does not allow it. Changes nothing on disk (``begin`` carries the decision out)."""
    out = Path(out)
    artifacts = tuple(run_artifacts(out))
    checkpoint = CheckpointManager(out).latest() if mode in ("resume", "auto") else None
    if checkpoint is not None:
        return RunStart(out, _resumed_run_id(out, checkpoint), checkpoint)
    if mode == "resume":
        saved_none = (" The run there saved none (checkpoint.every is 0, or it stopped before the first save)."
                      if artifacts else "")
        raise ResumeError(
            f"--resume: no checkpoint in {out / 'checkpoints'} (a complete step_N directory with driver.json)."
            f"{saved_none}"
            " Start without --resume for a new run (add --overwrite if the directory holds one), or use --resume auto"
            " to resume when a checkpoint exists and start fresh otherwise.")
    if artifacts and mode == "fresh":
        names = ", ".join(p.name for p in artifacts[:4])
        raise RunDirError(
            f"{out} already holds a run ({names}). Add --resume to continue it from its latest checkpoint, or "
            f"--overwrite to start over (the old run's files are moved to {out}.old-<time>; nothing is deleted); "
            "or choose a new output directory (run.output_dir; --out for quickstart).")
    why = {"overwrite": "--overwrite" if artifacts else "", "auto": f"--resume auto: no checkpoint in {out}"}
    return RunStart(out, uuid.uuid4().hex[:12], None, artifacts, why.get(mode, ""))


def _resumed_run_id(out: Path, checkpoint: Path) -> str:
    state = CheckpointManager(out).load_state(checkpoint)
    own = read_run_id(out)
    if state.run_id and own and state.run_id != own:
        raise ResumeError(
            f"the checkpoint {checkpoint} was written by run {state.run_id}, but {out / 'run.json'} belongs to run "
            f"{own}: the directory mixes two runs. Move the checkpoint back to its own run's directory, or start "
            "over with --overwrite (this directory's files are moved aside, not deleted).")
    return own or state.run_id or uuid.uuid4().hex[:12]


def begin(start: RunStart, name: str, echo: Callable[[str], None] = print,
          hub_models: Mapping[str, HubPin] | None = None) -> RunStart:
    """Carry out ``start``: move an earlier run aside, clear torn checkpoints, record the run id and, for a
    new run, the commit each Hub id of its models resolved to (a resumed run keeps its first record)."""
    out = start.output_dir
    out.mkdir(parents=True, exist_ok=True)
    if start.set_aside:
        aside = set_aside(out, start.set_aside)
        echo(f"{start.why}: moved the previous run's files from {out} to {aside}; starting a new run")
        start = replace(start, set_aside=())
    elif start.why:
        echo(f"{start.why}: starting a new run")
    if start.checkpoint is not None:
        CheckpointManager(out).clean_partial()
        echo(f"resuming run {start.run_id} from {start.checkpoint}")
    if read_run_id(out) != start.run_id:
        record = {"run_id": start.run_id, "name": name, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        if hub_models:
            record["hub_models"] = {key: asdict(pin) for key, pin in hub_models.items()}
        (out / "run.json").write_text(json.dumps(record, indent=1) + "\n")
    return start


def set_aside(out: Path, paths: Iterable[Path]) -> Path:
    """Move ``paths`` (inside ``out``) into a new sibling directory ``<out>.old-<time>``; returns it."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = out.with_name(f"{out.name}.old-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = out.with_name(f"{out.name}.old-{stamp}-{n}")
    aside.mkdir(parents=True)
    for path in paths:
        shutil.move(str(path), str(aside / path.name))
    return aside
