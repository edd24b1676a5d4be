"""Fault injection for the reward tests: signal the process that starts scoring a given response.

The reward functions in ``pool_rewards.py`` leave a mark "<response>.<pid>.<parent pid>.<time>" when they start a
sample; a ``SignalOnStart`` thread waits for a new mark of its response and signals that process (the
reward child) or its parent (the reward worker actor), so the fault lands mid-sample, mid-batch.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path


class SignalOnStart(threading.Thread):
    def __init__(self, marks: Path, response: str, sig: signal.Signals, parent: bool = False, timeout_s: float = 60):
        super().__init__(daemon=True)
        self.marks, self.response, self.sig, self.parent, self.timeout_s = Path(marks), response, sig, parent, timeout_s
        self.seen = set(os.listdir(marks))
        self.pid: int | None = None
        """The process signalled."""

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline and self.pid is None:
            for name in set(os.listdir(self.marks)) - self.seen:
                response, pid, ppid, _ = name.split(".")
                if response == self.response:
                    self.pid = int(ppid if self.parent else pid)
                    os.kill(self.pid, self.sig)
                    return
            time.sleep(0.01)

    def __enter__(self) -> SignalOnStart:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.join(timeout=self.timeout_s)
        assert self.pid is not None, f"no process started scoring {self.response!r}"


def gone(pid: int) -> bool:
    """The process has exited (or is a zombie waiting for its parent)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except OSError:
        return True


def wait_until(condition, timeout_s: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s waiting for {what}"
        time.sleep(0.05)
