"""Live progress line: step, reward, accuracy and seconds per step (rich), or plain log lines."""

from __future__ import annotations

import logging
import sys
import time

_log = logging.getLogger("gyre.progress")  # driver.log keeps a line per step (tracking/driver_log.py)


class Progress:
    def __init__(self, total: int, start: int = 0, enabled: bool = True, description: str = "GRPO"):
        self.enabled = enabled and sys.stderr.isatty()
        self.total = total
        self._plain = enabled and not self.enabled
        self._bar = None
        self._info = ""
        self._last_beat = 0.0
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                                     transient=False)
            self._bar.start()
            self._task = self._bar.add_task(description, total=total, completed=start, info="")

    def update(self, step: int, metrics: dict) -> None:
        info = self._info = _summary(metrics)
        _log.info("step %d/%d %s", step, self.total, info)
        if self._bar is not None:
            self._bar.update(self._task, completed=step, info=info)
        elif self._plain:
            print(f"step {step}/{self.total} {info}", file=sys.stderr, flush=True)

    def heartbeat(self, what: str, elapsed: float, usual: float | None) -> None:
        """A call is taking far longer than usual: show what the run is waiting on (a watchdog callback)."""
        usual_text = f", usually {usual:.1f} s" if usual is not None else ""
        beat = f"waiting {elapsed:.0f} s on {what}{usual_text}"
        if self._bar is not None:
            self._bar.update(self._task, info=f"{self._info}  [{beat}]")
        if time.monotonic() - self._last_beat > 30.0:  # a line every 30 s at most, in the log and a plain terminal
            self._last_beat = time.monotonic()
            _log.info(beat)
            if self._plain:
                print(beat, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def _summary(m: dict) -> str:
    parts = []
    for key, label, fmt in (("reward/mean", "reward", "{:.3f}"), ("accuracy", "acc", "{:.2f}"),
                            ("val/accuracy", "val_acc", "{:.2f}"), ("sft_loss", "loss", "{:.3f}"),
                            ("time/step", "s/step", "{:.2f}")):
        if m.get(key) is not None:
            parts.append(f"{label}={fmt.format(m[key])}")
    # Trained tokens per second, and the share of the step's generation thrown away (aborted, expired, ...).
    if m.get("rollout/tokens_trained") and m.get("time/step"):
        parts.append(f"tok/s={m['rollout/tokens_trained'] / m['time/step']:.0f}")
    if m.get("rollout/tokens_wasted_share") is not None:
        parts.append(f"wasted={m['rollout/tokens_wasted_share']:.0%}")
    # Failed rewards score 0: show them where they are seen, not only in the metrics.
    for key, label in (("reward/errors", "reward_errors"), ("reward/timeouts", "reward_timeouts")):
        if m.get(key):
            parts.append(f"{label}={m[key]}")
    return " ".join(parts)
