"""What a sandboxed run could leave behind on the host, for the sandbox tests to check.

Host changes are attributed to the run, never found by diffing shared directories: other programs write
to /tmp while the tests run. The kernel makes a process's fsuid the owner of every inode it creates, and
the sandboxed program cannot choose another: in root mode it runs as a per-run uid no other process has,
with no capabilities (no CAP_CHOWN or CAP_SETUID), no groups, ``PR_SET_NO_NEW_PRIVS`` (no set-uid exec)
and a seccomp filter. So whatever it names a file and wherever it puts it (nested directories
included), the entry carries that uid: any entry owned by it is the run's, and there must be none. A
filename nonce or a payload scan would not do: the program picks its names and bytes. Others' inodes
it can change are only the world-writable files (written, or hard-linked under a new name): those are
compared with their state before the run, as are the files a test names (by content). It cannot delete
or rename others' entries in the sticky world-writable directories (/tmp, /var/tmp, /dev/shm).

Where the run's uid is shared (user-namespace mode maps the program to the caller's uid; one test runs
the whole supervisor as ``nobody``), that uid's entries that are new or changed since before the run
are the run's: nothing the run makes is missed, but another program of the same uid writing meanwhile
(or one writing its own world-writable file, in either mode) would be blamed too.
"""

from __future__ import annotations

import os
import stat
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


def _scan(uid: int | None, shared: bool) -> dict[str, tuple[int, ...]]:
    """The entries under the watched directories a process of ``uid`` could have made or changed: those
    it owns, and regular files anyone may write (the only others' inodes it can write or hard-link).
    path -> (owner, inode, links, size, mtime, ctime; times in ns).

    Walks without following links, into every directory ``uid`` may enter: a process can create entries
    only where it can reach. A per-run uid has no groups and no ACL names it, so it enters others'
    directories through the other x bit alone; a shared uid may have groups (or ACL entries, shown in the
    group bits), so any of group or other x counts. Entries that vanish meanwhile are skipped."""
    found: dict[str, tuple[int, ...]] = {}
    others = (stat.S_IXGRP | stat.S_IXOTH) if shared else stat.S_IXOTH

    def enters(st: os.stat_result) -> bool:
        return stat.S_ISDIR(st.st_mode) and bool(st.st_mode & (stat.S_IXUSR if st.st_uid == uid else others))

    def reachable(path: str) -> bool:  # it and every directory above it
        parts = os.path.realpath(path).split("/")
        try:
            return all(enters(os.stat("/" + "/".join(parts[1:i]))) for i in range(1, len(parts) + 1))
        except OSError:
            return False

    todo = [d for d in {*_WATCHED_DIRS, tempfile.gettempdir()} if reachable(d)]
    while todo:
        try:
            entries = list(os.scandir(todo.pop()))
        except OSError:  # gone, or not listable by us
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if st.st_uid == uid or (stat.S_ISREG(st.st_mode) and st.st_mode & stat.S_IWOTH):
                found[entry.path] = (st.st_uid, st.st_ino, st.st_nlink, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if enters(st):
                todo.append(entry.path)
    return found


def _contents(files) -> dict[str, bytes | None]:
    contents = {}
    for path in files:
        try:
            with open(path, "rb") as f:
                contents[path] = f.read()
        except OSError:
            contents[path] = None
    return contents


def _shared_uid() -> int | None:
    """The host uid a run's files would carry when it is not a per-run uid: the caller's, in
    user-namespace and weak mode (None in root mode)."""
    from gyre.rewards.sandbox import sandbox_capabilities

    return None if sandbox_capabilities()["mode"] == "root" else os.geteuid()


def host_state(*files: str, uid: int | None = None) -> dict:
    """Taken before a run: the content of ``files``, the world-writable files, and what the run's uid
    owns already when that uid is shared (``uid``; by default the caller's outside root mode)."""
    uid = _shared_uid() if uid is None else uid
    return {"files": _contents(files), "uid": uid, "entries": _scan(uid, shared=True) if uid is not None
            else _scan(None, shared=False)}


def host_changes(before: dict, run_uid: int | None = None) -> list[str]:
    """What the run changed on the host since ``before``: named files whose content differs; entries of
    the run's uid (``run_uid`` when it is a per-run uid: all of them, nothing else has that uid; else the
    shared uid ``before`` holds: the new or changed ones); world-writable files written since, and new
    hard links to them."""
    changed = [f"{path} (content)" for path, data in _contents(before["files"]).items()
               if data != before["files"][path]]
    per_run = run_uid is not None and run_uid >= UID_BASE
    uid = run_uid if per_run else before["uid"]
    if uid is None:
        raise AssertionError(f"no uid to attribute the run's host changes to (the run reported {run_uid})")
    for path, now in sorted(_scan(uid, shared=not per_run).items()):
        old = before["entries"].get(path)
        if now[0] == uid:
            bad = per_run or old != now
        else:  # a world-writable file: written (inode, size, mtime) or linked to (links) since
            bad = now[1:5] != old[1:5] if old is not None else now[2] > 1
        if bad:
            changed.append(path)
    return changed


def assert_host_clean(before: dict, stub: int | None, uid: int | None, wait_s: float = 3.0) -> None:
    """No process of the run (stub pid ``stub``, per-run uid ``uid``) is alive and the run changed nothing
    on the host since ``before``. A killed process needs a moment to finish exiting, hence the short poll;
    the host is checked after, when nothing of the run can still write."""
    deadline = time.monotonic() + wait_s
    while sandbox_processes(stub, uid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sandbox_processes(stub, uid) == [], "a sandboxed process outlived its run"
    changes = host_changes(before, uid)
    assert not changes, f"the run changed the host: {changes[:10]}"
