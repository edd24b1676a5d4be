"""``RUN_DIR/run_info.json``: what ran, where and with which software, written when a run starts.

``{gyre, torch, transformers, ray, python, git_commit, placement, started}``: the versions of the
libraries that shape the numbers, the commit of gyre's own source checkout (None when gyre is not run
from a git checkout), the placement plan as ``gyre check`` prints it, and the start time (ISO 8601, UTC).
"""

from __future__ import annotations

import datetime
import json
import platform
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
    """The commit checked out at ``where`` (a clean or dirty tree alike), or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and len(commit) == 40 else None


def run_info(placement: str) -> dict:
    import gyre

    return {"gyre": gyre.__version__, "torch": _version("torch"), "transformers": _version("transformers"),
            "ray": _version("ray"), "python": platform.python_version(),
            "git_commit": git_commit(Path(gyre.__file__).resolve().parent),
            "placement": placement,
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def write_run_info(output_dir: str | Path, placement: str) -> Path:
    path = Path(output_dir) / RUN_INFO
    path.write_text(json.dumps(run_info(placement), indent=2) + "\n")
    return path
