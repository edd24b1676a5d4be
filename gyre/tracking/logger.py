"""Write per-step metrics to ``metrics.jsonl`` and TensorBoard.

On resume, records after the checkpointed step are dropped from the JSONL file (they belong to steps
that will run again) and TensorBoard purges them too, so every step appears exactly once. The logger
never deletes files: a fresh run gets a directory with no earlier run in it (``pipelines/rundir.py``).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path


class MetricsLogger:
    def __init__(self, output_dir: str | Path, tensorboard: bool = True, resume_step: int | None = None,
                 restart: bool = False):
        """``resume_step``: continue a run from that checkpointed step. ``restart``: the same run starts
        over from scratch after a fault before its first checkpoint (its own records are dropped)."""
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        if restart:
            resume_step = BEFORE_EVERYTHING
        self._sft_purge = 0 if restart else None
        if resume_step is not None:
            self._truncate_after(resume_step)
        self._fh = self.path.open("a")
        self._tb = self._sft_tb = None
        self._tensorboard = tensorboard
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # RL scalars live in tensorboard/rl; a resume purges the steps it will run again.
            purge = resume_step + 1 if resume_step is not None else None
            self._tb = SummaryWriter(str(self.dir / "tensorboard" / "rl"), purge_step=purge)

    def _truncate_after(self, step: int) -> None:
        truncate_after(self.path, step)

    def log(self, step: int, metrics: dict[str, float], phase: str = "train") -> None:
        record = {"step": step, "phase": phase, "time": round(time.time(), 3),
                  **{k: _clean(v) for k, v in metrics.items()}}
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()
        writer = self._writer(phase)
        if writer is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    writer.add_scalar(key, value, step)

    def _writer(self, phase: str):
        """SFT warm-up steps go to their own run (tensorboard/sft): they have a step axis of their own."""
        if phase != "sft" or not self._tensorboard:
            return self._tb
        if self._sft_tb is None:
            from torch.utils.tensorboard import SummaryWriter

            self._sft_tb = SummaryWriter(str(self.dir / "tensorboard" / "sft"), purge_step=self._sft_purge)
        return self._sft_tb

    def close(self) -> None:
        self._fh.close()
        for writer in (self._tb, self._sft_tb):
            if writer is not None:
                writer.close()


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


def read_metrics(path: str | Path) -> list[dict]:
    out = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            out.append(json.loads(line))
    return out
