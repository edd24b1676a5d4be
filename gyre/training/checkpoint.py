"""Atomic, resumable checkpoints of a run.

Layout under ``<output_dir>/checkpoints``::

    step_000040/            a complete checkpoint
        policy/             model + optimizer (torch.distributed.checkpoint, one shard file per rank)
                            and each rank's LR schedule and RNG state
        critic/             the same for the critic, when the algorithm has one
        critic.0/ ...       the same for each of several critics (critic.num_critics > 1), instead
        driver.json         step, data position, weight version, config fingerprint, run id
    latest                  name of the newest complete checkpoint

A checkpoint is written into ``step_XXXXXX.tmp`` and renamed only once complete, and ``latest`` is
replaced atomically after that, so a run killed at any instant leaves either the old or the new
checkpoint intact, never a torn one. Incomplete ``.tmp`` directories are removed on resume. Pruning
orders checkpoints by step number and never removes the one ``latest`` names; a missing or stale
``latest`` falls back to the highest complete checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

_STEP_DIR = re.compile(r"^step_(\d+)$")


class ResumeError(ValueError):
    """A checkpoint cannot continue this run (none there, another run's, different data, unreadable)."""


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
    run_id: str = ""
    """The run that wrote it (``run.json``); empty in checkpoints written before run ids existed."""
    rollout: dict = field(default_factory=dict)
    """The rollout scheduler's prompts drawn and not yet trained on (``RolloutScheduler.state_dict``)."""


class CheckpointManager:
    def __init__(self, output_dir: str | Path, keep_last: int = 2, run_id: str = ""):
        self.root = Path(output_dir) / "checkpoints"
        self.keep_last = keep_last
        self.run_id = run_id
        """Stamped into every checkpoint this manager commits."""

    def begin(self, step: int) -> Path:
        """A fresh temporary directory to write step ``step`` into; returns its policy/ path's parent."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f"step_{step:06d}.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        (tmp / "policy").mkdir(parents=True)
        return tmp

    def commit(self, tmp: Path, state: DriverState) -> Path:
        """Write the driver state (stamped with this run's id), then publish ``tmp`` as a complete checkpoint."""
        state = replace(state, run_id=self.run_id)
        _write_atomic(tmp / "driver.json", json.dumps(asdict(state), indent=2))
        _fsync_tree(tmp)
        final = tmp.with_suffix("")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _write_atomic(self.root / "latest", final.name)
        self._prune()
        return final

    def complete(self) -> list[tuple[int, Path]]:
        """(step, directory) of every complete checkpoint, by step number."""
        if not self.root.is_dir():
            return []
        found = []
        for path in self.root.iterdir():
            match = _STEP_DIR.match(path.name)
            if match and (path / "driver.json").is_file():
                found.append((int(match.group(1)), path))
        return sorted(found)

    def latest(self) -> Path | None:
        """The checkpoint ``latest`` names; if that is missing or incomplete, the highest complete one."""
        pointer = self.root / "latest"
        if pointer.is_file():
            path = self.root / pointer.read_text().strip()
            if _STEP_DIR.match(path.name) and (path / "driver.json").is_file():
                return path
        done = self.complete()
        return done[-1][1] if done else None

    def load_state(self, path: Path) -> DriverState:
        try:
            return DriverState(**json.loads((path / "driver.json").read_text()))
        except (OSError, TypeError, ValueError) as exc:
            raise ResumeError(f"cannot read the checkpoint at {path}: {exc}; resume from another checkpoint "
                              "(point checkpoints/latest at it) or start over with --overwrite") from None

    def clean_partial(self) -> None:
        """Remove torn checkpoints (``.tmp`` directories a killed run was writing)."""
        for tmp in self.root.glob("step_*.tmp"):
            shutil.rmtree(tmp, ignore_errors=True)

    def _prune(self) -> None:
        """Keep the ``keep_last`` highest steps and whatever ``latest`` names."""
        keep = self.latest()
        for _, path in self.complete()[:-self.keep_last]:
            if path != keep:
                shutil.rmtree(path, ignore_errors=True)


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
