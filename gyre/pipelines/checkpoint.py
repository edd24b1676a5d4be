"""Atomic, resumable checkpoints of a run.

Layout under ``<output_dir>/checkpoints``::

    step_000040/            a complete checkpoint
        policy/             model + optimizer (torch.distributed.checkpoint, one shard file per rank)
                            and each rank's LR schedule and RNG state
        critic/             the same for the critic, when the algorithm has one
        driver.json         step, data position, weight version, config fingerprint
    latest                  name of the newest complete checkpoint

A checkpoint is written into ``step_XXXXXX.tmp`` and renamed only once complete, and ``latest`` is
replaced atomically after that, so a run killed at any instant leaves either the old or the new
checkpoint intact, never a torn one. Incomplete ``.tmp`` directories are removed on resume.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path


class ResumeError(ValueError):
    """A checkpoint cannot continue this run (different data or seed, unreadable state)."""


@dataclass
class DriverState:
    """What the driver needs, beside the trainer's own state, to continue a run exactly."""

    step: int
    """RL steps completed."""
    data: dict
    """EpochSampler state of the training prompts."""
    weight_version: int
    run_steps: int
    """run.steps when saved: the LR schedule's horizon."""
    config_hash: str = ""
    reward_totals: dict = field(default_factory=dict)
    """Cumulative reward error and timeout counts."""
    val_history: list = field(default_factory=list)
    """Held-out accuracy at each validation so far."""
    algorithm: dict = field(default_factory=dict)
    """Algorithm state across steps: running reward moments, the adaptive KL coefficient."""


class CheckpointManager:
    def __init__(self, output_dir: str | Path, keep_last: int = 2):
        self.root = Path(output_dir) / "checkpoints"
        self.keep_last = keep_last

    def begin(self, step: int) -> Path:
        """A fresh temporary directory to write step ``step`` into; returns its policy/ path's parent."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f"step_{step:06d}.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        (tmp / "policy").mkdir(parents=True)
        return tmp

    def commit(self, tmp: Path, state: DriverState) -> Path:
        """Write the driver state, then publish ``tmp`` as a complete checkpoint."""
        _write_atomic(tmp / "driver.json", json.dumps(asdict(state), indent=2))
        _fsync_tree(tmp)
        final = tmp.with_suffix("")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _write_atomic(self.root / "latest", final.name)
        self._prune()
        return final

    def latest(self) -> Path | None:
        pointer = self.root / "latest"
        if not pointer.is_file():
            return None
        path = self.root / pointer.read_text().strip()
        return path if (path / "driver.json").is_file() else None

    def load_state(self, path: Path) -> DriverState:
        try:
            return DriverState(**json.loads((path / "driver.json").read_text()))
        except (OSError, TypeError, ValueError) as exc:
            raise ResumeError(f"cannot read the checkpoint at {path}: {exc}") from None

    def find_resume_point(self, resume: bool, echo: Callable[[str], None]) -> Path | None:
        """The checkpoint to continue from (None: start fresh); removes torn partial checkpoints."""
        if not resume:
            return None
        self.clean_partial()
        latest = self.latest()
        echo(f"resuming from {latest}" if latest else "no checkpoint found: starting from scratch")
        return latest

    def clean_partial(self) -> None:
        for tmp in self.root.glob("step_*.tmp"):
            shutil.rmtree(tmp, ignore_errors=True)

    def _prune(self) -> None:
        done = sorted(p for p in self.root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp"))
        for old in done[:-self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".partial")
    with tmp.open("w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _fsync_tree(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            with path.open("rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
