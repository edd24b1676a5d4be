"""What a sandboxed run could leave behind on the host, for the sandbox tests to compare."""

from __future__ import annotations

import os
import tempfile
import time

from gyre.rewards.sandbox.local import UID_BASE

_WATCHED_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/mnt", "/media", "/srv", "/opt", "/root")
_INIT_MARK = b"main(int(sys.argv[1]))"
"""In the command line of every sandbox stub and namespace init (see local._init_source)."""


def _processes():
    """(pid, ppid, session, uid, cmdline) of every live (not zombie) process."""
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/status") as f:
                uid = int(next(line.split()[1] for line in f if line.startswith("Uid:")))
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, StopIteration, ValueError):
            continue
        if fields[0] != "Z":
            yield int(entry), int(fields[1]), int(fields[3]), uid, cmdline


def sandbox_processes(stub: int | None = None, uid: int | None = None) -> list[int]:
    """Live processes of one sandbox run (the stub pid ``stub``, its session, and the run's uid ``uid``),
    or of any sandbox run when ``stub`` is None."""
    found = []
    for pid, _, session, owner, cmdline in _processes():
        if stub is None:
            mine = owner >= UID_BASE or _INIT_MARK in cmdline
        else:
            mine = pid == stub or session == stub or owner == uid
        if mine:
            found.append(pid)
    return found


def run_uid(stub: int) -> int | None:
    """The per-run uid of the live run whose stub is ``stub`` (its program runs in the stub's session)."""
    for _, _, session, owner, _ in _processes():
        if session == stub and owner >= UID_BASE:
            return owner
    return None


def stubs_of(parent: int) -> list[int]:
    """Sandbox stubs started by process ``parent``."""
    return [pid for pid, ppid, _, _, cmdline in _processes() if ppid == parent and _INIT_MARK in cmdline]


def host_state(*files: str) -> dict:
    """Entries of the world-writable and root directories, and the content of ``files``."""
    dirs = {d: sorted(os.listdir(d)) for d in {*_WATCHED_DIRS, tempfile.gettempdir()} if os.path.isdir(d)}
    contents = {}
    for path in files:
        try:
            with open(path, "rb") as f:
                contents[path] = f.read()
        except OSError:
            contents[path] = None
    return {"dirs": dirs, "files": contents}


def assert_host_clean(before: dict, stub: int | None, uid: int | None, wait_s: float = 3.0) -> None:
    """No process of the run (stub pid ``stub``, per-run uid ``uid``) is alive and nothing changed on the
    host since ``before``. A killed process needs a moment to finish exiting, hence the short poll."""
    deadline = time.monotonic() + wait_s
    while sandbox_processes(stub, uid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sandbox_processes(stub, uid) == [], "a sandboxed process outlived its run"
    after = host_state(*before["files"])
    assert after == before, "the run changed the host"
