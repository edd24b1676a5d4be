"""``RUN_DIR/run_info.json``: what ran, where and with which software, written when a run starts.

``{gyre, torch, transformers, ray, python, git_commit, placement, started}``: the versions of the
libraries that shape the numbers, the commit of gyre's own source checkout (None when gyre is not run
from its own git checkout), the placement plan as ``gyre check`` prints it, and the start time (ISO 8601,
UTC). Written once, at the run's first start; a resume or a recovery keeps those fields and appends
``{started, versions, git_commit}`` to a ``sessions`` list (the software may have changed in between).
"""

from __future__ import annotations

import datetime
import json
import platform
import re
import subprocess
from importlib import metadata
from pathlib import Path

RUN_INFO = "run_info.json"


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def git_commit(where: Path) -> str | None:
    """The commit of gyre's own checkout at ``where`` (a clean or dirty tree alike), or None when ``where`` is
    not in one: gyre installed into a virtual environment that lives inside the user's repository would
    otherwise report the user's commit."""
    top = _git(where, "rev-parse", "--show-toplevel")
    if top is None or not is_gyre_checkout(Path(top)):
        return None
    commit = _git(where, "rev-parse", "HEAD")
    return commit if commit is not None and len(commit) == 40 else None


def is_gyre_checkout(top: Path) -> bool:
    """Whether ``top`` is gyre's source tree: a ``gyre/`` package and a pyproject.toml naming project gyre."""
    try:  # a line match, not tomllib: gyre supports Python 3.10, which has no TOML reader
        text = (top / "pyproject.toml").read_text()
    except (OSError, ValueError):
        return False
    named = re.search(r'^\[project\][^\[]*?^name\s*=\s*["\']gyre["\']\s*$', text, flags=re.M | re.S) is not None
    return named and (top / "gyre" / "__init__.py").is_file()


def _git(where: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=where, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _session() -> dict:
    import gyre

    return {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "versions": {"gyre": gyre.__version__, "torch": _version("torch"),
                         "transformers": _version("transformers"), "ray": _version("ray"),
                         "python": platform.python_version()},
            "git_commit": git_commit(Path(gyre.__file__).resolve().parent)}


def run_info(placement: str) -> dict:
    session = _session()
    return {**session["versions"], "git_commit": session["git_commit"], "placement": placement,
            "started": session["started"]}


def write_run_info(output_dir: str | Path, placement: str) -> Path:
    """Write run_info.json at a run's first start; at a later start (resume, recovery) append a session."""
    path = Path(output_dir) / RUN_INFO
    info = _earlier(path)
    if info is None:
        info = run_info(placement)
    else:
        earlier = info.get("sessions")
        info["sessions"] = [*(earlier if isinstance(earlier, list) else []), _session()]
    path.write_text(json.dumps(info, indent=2) + "\n")
    return path


def _earlier(path: Path) -> dict | None:
    """The run_info.json of this run's earlier start (None when absent or unreadable: written afresh)."""
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None
