"""The sandbox tests' host check (``sandbox_host.py``) against a process that did get out: a real process
of a run's kind of uid writes to the host the ways an escaped program could, under names it chooses,
while another program writes beside it. Each write is blamed; the other program's files never are."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import pytest

from gyre.rewards.sandbox.local import UID_BASE
from tests.rewards.sandbox_host import host_changes, host_state

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="needs root and setpriv to act as another uid")
ESCAPED = UID_BASE + (34 << 22) + os.getpid() % 4_000_000
"""A per-run-style uid that no sandbox run gets (their uids stay below UID_BASE + 34 << 22)."""

ATTACKS = {
    "nested file": "mkdir -p $D/a/b && echo pwned > $D/a/b/results.txt",
    "hidden file": "echo pwned > $D/.cache",
    "directory": "mkdir $D/x",
    "symlink": "ln -s /etc/passwd $D/link",
    "fifo": "mkfifo $D/pipe",
    "write to a world-writable file": "echo pwned >> $D/shared.log",
    "hard link to a world-writable file": "ln $D/shared.log $D/innocent",
}


@pytest.fixture
def host_dir():
    """A world-writable sticky directory (like /tmp) in a directory every uid can reach, holding a
    world-writable file of another user."""
    sticky = [d for d in ("/tmp", "/var/tmp", "/dev/shm") if os.path.isdir(d) and os.stat(d).st_mode & 0o1003 == 0o1003]
    base = sticky[0] if sticky else None
    if base is None:
        pytest.skip("no world-writable sticky directory")
    path = tempfile.mkdtemp(prefix="gyre-host-check-", dir=base)
    os.chmod(path, 0o1777)
    with open(os.path.join(path, "shared.log"), "w") as f:
        f.write("log\n")
    os.chmod(os.path.join(path, "shared.log"), 0o666)
    yield path
    shutil.rmtree(path)


def act(uid: int, script: str, where: str) -> None:
    subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sh", "-ec", script],
                   env={"PATH": "/usr/bin:/bin", "D": where}, check=True, timeout=30)


def other_program(where: str) -> None:
    """Another program (this test's uid) writing beside the run: new files, nested, and gone again."""
    os.makedirs(os.path.join(where, "theirs", "deep"))
    for name in ("noise.1", "theirs/deep/noise.2"):
        with open(os.path.join(where, name), "w") as f:
            f.write("x")
    os.unlink(os.path.join(where, "noise.1"))


@pytest.mark.parametrize("attack", ATTACKS.values(), ids=ATTACKS.keys())
def test_a_per_run_uids_host_writes_are_blamed_and_others_are_not(host_dir, attack):
    before = host_state()
    other_program(host_dir)
    assert host_changes(before, ESCAPED) == []
    act(ESCAPED, attack, host_dir)
    changes = host_changes(before, ESCAPED)
    assert changes and all(c.startswith(host_dir) for c in changes), changes


@pytest.mark.parametrize("attack", ATTACKS.values(), ids=ATTACKS.keys())
def test_a_shared_uids_new_host_writes_are_blamed(host_dir, attack):
    shared = ESCAPED - 1
    act(shared, "echo old > $D/mine", host_dir)  # what the uid owned before the run is not the run's
    before = host_state(uid=shared)
    other_program(host_dir)
    assert host_changes(before) == []
    act(shared, attack, host_dir)
    changes = host_changes(before)
    assert changes and all(c.startswith(host_dir) for c in changes), changes


def test_named_files_are_compared_by_content(host_dir):
    secret = os.path.join(host_dir, "shared.log")
    before = host_state(secret)
    with open(secret, "a") as f:  # a change by any uid (the test's own here, which owns nothing of the run)
        f.write("more\n")
    assert f"{secret} (content)" in host_changes(before, ESCAPED)
