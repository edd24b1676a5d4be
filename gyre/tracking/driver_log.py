"""``driver.log``: what the driver said and did, kept in the run directory.

The terminal shows a live progress bar and the messages of the moment; a run on a cluster, or one that
ended overnight, needs them on disk. The log holds every message the driver prints (pre-flight, the data
line with its over-long prompt counts, the placement plan, faults and recoveries), a line per step from
the progress summary, gyre's logged warnings, and the full traceback of an error that ends the run (the terminal gets a
one-paragraph message instead). Messages printed before the run directory is decided (pre-flight runs
first) are held and written once it is. A resumed run appends, under a line that says so.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from pathlib import Path

LOGGER = "gyre"
"""Records of this logger and its children (e.g. ``gyre.rollout.driver``'s warnings) go to the log."""
QUIET = ("gyre.driver", "gyre.progress")
"""Loggers for lines the terminal already shows (echoed messages, the progress bar): the log only."""
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class DriverLog:
    """Tee the driver's messages into ``RUN_DIR/driver.log`` once the run directory is known."""

    def __init__(self, echo: Callable[[str], None]):
        self._echo = echo
        self._held: list[str] = []
        self._handler: logging.FileHandler | None = None
        self.path: Path | None = None

    def echo(self, message: str) -> None:
        """Print ``message`` as before, and keep it in the log."""
        self._echo(message)
        self.write(message)

    def write(self, message: str) -> None:
        if self._handler is None:
            self._held.append(message)
        else:
            logging.getLogger("gyre.driver").info(message)

    def attach(self, output_dir: Path, resumed: bool) -> None:
        """Open the log in ``output_dir`` and write what was held; from now on ``gyre.*`` records go there too."""
        self.path = Path(output_dir) / "driver.log"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(self.path, mode="a", encoding="utf-8")
        handler.setFormatter(logging.Formatter(_FORMAT))
        handler.setLevel(logging.INFO)
        logging.getLogger(LOGGER).addHandler(handler)
        self._saved = {name: (logging.getLogger(name).level, logging.getLogger(name).propagate) for name in QUIET}
        for name in QUIET:
            quiet = logging.getLogger(name)
            quiet.addHandler(handler)
            quiet.setLevel(logging.INFO)
            quiet.propagate = False
        self._handler = handler
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self.write(f"==== {'resumed' if resumed else 'started'} {stamp} ====")
        for message in self._held:
            self.write(message)
        self._held.clear()

    def error(self, exc: BaseException) -> None:
        """Keep the whole traceback of the error that ends the run (the terminal shows a short message)."""
        if self._handler is not None:
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            logging.getLogger("gyre.driver").error("the run stopped:\n%s", text.rstrip())

    def close(self) -> None:
        if self._handler is None:
            return
        for name in (LOGGER, *QUIET):
            logging.getLogger(name).removeHandler(self._handler)
        for name, (level, propagate) in self._saved.items():  # as they were before the run
            logging.getLogger(name).setLevel(level)
            logging.getLogger(name).propagate = propagate
        self._handler.close()
        self._handler = None
