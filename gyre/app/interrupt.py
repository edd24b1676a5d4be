"""Stop a run promptly and cleanly on SIGINT (Ctrl-C) or SIGTERM.

The first signal raises RunInterrupted in the main thread, wherever the driver is waiting (a Ray call,
a data load), so the run's ``finally`` blocks kill the actors, shut Ray down and close the metric
files on the way out. A second signal, or a cleanup that takes longer than ``FORCE_AFTER_S``, exits
at once, after killing every process the driver started (Ray's raylet, its agents and workers),
since a forced exit skips Ray's shutdown.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from pathlib import Path

FORCE_AFTER_S = 15.0
"""Longest clean stop before gyre exits without finishing it."""


class RunInterrupted(BaseException):
    """The first SIGINT or SIGTERM. A BaseException, like KeyboardInterrupt, so that no ``except
    Exception`` on the way out swallows it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.output_dir: Path | None = None
        """The run directory, once a run had started in it (set by ``launch.train``)."""

    @property
    def exit_code(self) -> int:
        """The shell's convention: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + self.signum


def interruption_in(exc: BaseException) -> RunInterrupted | None:
    """The RunInterrupted behind ``exc``, if any: the handler's exception raised while the main thread was
    inside native code (Ray's wait) can surface as that code's SystemError, with ours as its context."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, RunInterrupted):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


@contextmanager
def stop_on_signals():
    """Within the block, SIGINT and SIGTERM raise RunInterrupted once, then force the exit. Signal
    handlers can only be set from the main thread; elsewhere the block changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.getsignal(s) for s in signals}
    timers: list[threading.Timer] = []

    def force(signum, frame) -> None:
        os.write(2, b"gyre: second signal: exiting at once\n")
        _exit_now(signum)

    def first(signum, frame) -> None:
        for s in signals:
            signal.signal(s, force)
        timer = threading.Timer(FORCE_AFTER_S, _exit_late, args=(signum,))
        timer.daemon = True
        timer.start()
        timers.append(timer)
        name = signal.Signals(signum).name
        # os.write, not print: the main thread may be inside a print to the same stream right now.
        os.write(2, f"gyre: {name}: stopping (killing actors, shutting Ray down); again to exit at once\n".encode())
        raise RunInterrupted(signum)

    for s in signals:
        signal.signal(s, first)
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - only to unwrap an interruption raised inside native code
        interrupted = interruption_in(exc)
        if interrupted is None:
            raise
        raise interrupted from None
    finally:
        for timer in timers:
            timer.cancel()
        for s, handler in previous.items():
            signal.signal(s, handler)


def _exit_late(signum: int) -> None:
    os.write(2, f"gyre: the clean stop took over {FORCE_AFTER_S:g} s: exiting at once\n".encode())
    _exit_now(signum)


def _exit_now(signum: int) -> None:
    for pid in _descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    os._exit(128 + signum)


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` (from /proc; empty where there is none)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name (field 2) may hold spaces: the parent pid comes after its closing ')'.
            ppid = int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found
