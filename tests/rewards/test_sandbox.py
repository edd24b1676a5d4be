"""The sandbox with real processes: what normal programs can do, limits, and the Python layer.

The kernel containment against hostile programs (with the Python layer switched off) is in
``test_sandbox_attacks.py``.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time

import pytest

from gyre.rewards.sandbox import SandboxLimits, run_python, sandbox_capabilities
from gyre.rewards.sandbox.boot import resolve
from tests.rewards.sandbox_host import assert_host_clean, host_state

LIMITS = SandboxLimits(cpu_s=2, wall_s=2.0, memory_mb=256)
CAPS = sandbox_capabilities()
BOTH = pytest.mark.parametrize("audit", [True, False], ids=["all-layers", "kernel-only"])


def still_works() -> None:
    out = run_python("print(6 * 7)", limits=LIMITS)
    assert (out.status, out.stdout) == ("ok", "42\n")


def test_capabilities_report_each_layer():
    assert CAPS["mode"] in ("root", "userns", "weak")
    for layer in ("pid_namespace", "mount_namespace", "private_root", "network_namespace", "ipc_namespace",
                  "per_run_uid", "user_namespace", "seccomp", "no_new_privs", "rlimits", "audit_hook"):
        assert isinstance(CAPS[layer], bool), layer
    if os.geteuid() == 0 and CAPS["mode"] == "root":
        assert CAPS["per_run_uid"] and CAPS["pid_namespace"] and CAPS["private_root"]


def test_program_reads_stdin_and_writes_stdout_in_its_own_dir():
    src = "import os\nprint(input()[::-1])\nopen('f', 'w').write('x')\nprint(os.listdir('.'), os.getcwd())\n"
    out = run_python(src + "print(open('/dev/stdin').read())", "abc\ndef", LIMITS)
    assert out.status == "ok" and out.returncode == 0
    assert out.stdout == "cba\n['f'] /work\nabc\ndef\n"
    assert out.seconds < LIMITS.wall_s


def test_errors_exit_codes_and_stdlib():
    out = run_python("def f():\n    raise KeyError(7)\nf()", limits=LIMITS)
    assert out.status == "error" and out.returncode == 1 and "KeyError: 7" in out.stderr
    assert "_child_main" not in out.stderr and "main(cfg)" not in out.stderr  # the traceback starts at the program
    out = run_python("x = (", limits=LIMITS)
    assert out.status == "error" and "SyntaxError" in out.stderr
    out = run_python("import sys\nprint('a')\nsys.exit(3)", limits=LIMITS)
    assert (out.status, out.returncode, out.stdout) == ("error", 3, "a\n")
    src = ("import asyncio, collections, heapq, json, re, random, typing, dataclasses, fractions, decimal, sqlite3\n"
           "async def f():\n    return collections.namedtuple('P', 'x')(1).x\nprint(asyncio.run(f()))\n"
           "import os, tempfile\nfd, name = tempfile.mkstemp()\nos.write(fd, b'x')\nprint(open('/dev/null').read())")
    out = run_python(src, limits=LIMITS)
    assert (out.status, out.stdout) == ("ok", "1\n\n"), out.stderr


def test_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv("GYRE_TEST_SECRET_TOKEN", "hunter2")
    out = run_python("import os\nprint(dict(os.environ))", limits=LIMITS)
    assert out.status == "ok" and "hunter2" not in out.stdout


def test_nothing_is_left_on_the_host():
    before = host_state()
    out = run_python("import os\nfor i in range(50):\n    open(f'f{i}', 'w').write('x' * 1000)\nprint(os.getcwd())",
                     limits=LIMITS)
    assert (out.status, out.stdout) == ("ok", "/work\n")
    assert_host_clean(before, out.pid, out.uid)


@BOTH
def test_infinite_loop_is_killed_on_the_wall_clock(audit):
    limits = SandboxLimits(cpu_s=10, wall_s=1.0)
    before = host_state()
    start = time.monotonic()  # the run's time, not the host scan's
    out = run_python("while True:\n    pass", limits=limits, audit_hook=audit)
    assert out.status == "timeout" and time.monotonic() - start < limits.wall_s + 1.5
    assert_host_clean(before, out.pid, out.uid)
    still_works()


def test_cpu_limit_is_a_timeout():
    out = run_python("while True:\n    pass", limits=SandboxLimits(cpu_s=1, wall_s=10.0))
    assert out.status == "timeout" and out.returncode == -signal.SIGXCPU  # the CPU limit, not the wall clock
    out = run_python("import time\ntime.sleep(5)", limits=SandboxLimits(wall_s=0.5))  # sleeping uses no CPU
    assert out.status == "timeout" and out.seconds < 1.5


@BOTH
@pytest.mark.parametrize("hog", ["x = bytearray(10**10)", "x = []\nwhile True:\n    x.append(bytearray(10**6))"],
                         ids=["one-huge", "growing"])
def test_memory_hogs_hit_the_address_space_limit(hog, audit):
    out = run_python(hog, limits=SandboxLimits(wall_s=5.0, memory_mb=128), audit_hook=audit)
    assert out.status == "memory", out
    still_works()


def test_deep_recursion_in_a_thread_is_allowed():
    src = ("import sys, threading\nsys.setrecursionlimit(10**6)\nthreading.stack_size(2**26)\n"
           "def f(n):\n    return 0 if n == 0 else 1 + f(n - 1)\n"
           "t = threading.Thread(target=lambda: print(f(50000)))\nt.start()\nt.join()")
    out = run_python(src, limits=SandboxLimits(wall_s=5.0, processes=1))
    assert (out.status, out.stdout) == ("ok", "50000\n"), out.stderr


def test_python_layer_blocks_what_programs_never_need():
    for src in ["import socket\nsocket.socket()", "import _socket\n_socket.socket(2, 1)",
                "import os\nfd = os.open('.', os.O_RDONLY)",  # directory descriptors would defeat path checks
                "import gc\ngc.get_objects()", "import sys\nsys.settrace(lambda *a: None)",
                "import os\nos.kill(os.getppid(), 9)", "f = lambda: 0\nf.__code__.replace(co_name='g')",
                "import subprocess\nsubprocess.run(['true'])", "import ctypes"]:
        out = run_python(src, limits=LIMITS)
        assert out.status == "blocked" and "[gyre-sandbox] blocked" in out.stderr, src
    still_works()


def test_python_layer_cannot_be_fooled_by_monkeypatching():
    src = ("import os, posixpath, builtins\nos.path.realpath = posixpath.realpath = lambda p, **k: '/work/x'\n"
           "os.lstat = lambda p: None\nbuiltins.type = lambda o: str\nprint(open('/usr/x').read())")
    out = run_python(src, limits=LIMITS)
    assert out.status == "blocked"


def test_allow_read_binds_only_the_listed_path():
    shared = tempfile.mkdtemp(prefix="gyre-test-")
    os.chmod(shared, 0o755)
    try:
        for name in ("data.txt", "other.txt"):
            with open(os.path.join(shared, name), "w") as f:
                f.write(name.upper())
            os.chmod(os.path.join(shared, name), 0o644)
        limits = SandboxLimits(wall_s=2.0, allow_read=(os.path.join(shared, "data.txt"),))
        out = run_python(f"print(open({shared + '/data.txt'!r}).read())", limits=limits)
        assert (out.status, out.stdout) == ("ok", "DATA.TXT\n")
        for audit in (True, False):
            out = run_python(f"print(open({shared + '/other.txt'!r}).read())", limits=limits, audit_hook=audit)
            assert out.status in ("blocked", "error") and "OTHER" not in out.stdout
    finally:
        for name in os.listdir(shared):
            os.unlink(os.path.join(shared, name))
        os.rmdir(shared)


def test_output_flood_is_truncated_and_stopped():
    limits = SandboxLimits(wall_s=5.0, output_bytes=10_000)
    before = host_state()
    out = run_python("while True:\n    print('x' * 100)", limits=limits)
    assert out.status == "error" and len(out.stdout) <= 10_000 and out.stdout.startswith("x" * 100)
    assert "output limit" in out.stderr and out.seconds < 2.0
    assert_host_clean(before, out.pid, out.uid)
    still_works()


def test_data_channels_carry_bytes_to_the_parent():
    out = run_python("import os\nos.write(3, b'first')\nos.close(3)\nos.write(4, b'second' * 1000)", limits=LIMITS,
                     channels=2)
    assert out.status == "ok" and out.channels == [b"first", b"second" * 1000]


def test_resolver_follows_links_and_dots(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "d")
    (tmp_path / "abs").symlink_to("/etc")
    here = os.path.realpath(tmp_path)
    real = lambda p: resolve(p, here, os.lstat, os.readlink)
    assert real("link/x") == f"{here}/d/x"
    assert real("abs/passwd") == "/etc/passwd"
    assert real("d/../../..") == os.path.dirname(os.path.dirname(here))
    assert real("/a/./b//c/") == "/a/b/c"


def test_data_channels_have_a_cap_of_their_own():
    """stdout and stderr are kept up to output_bytes each, each data channel up to channel_bytes."""
    limits = SandboxLimits(cpu_s=2, wall_s=5.0, memory_mb=256, output_bytes=10_000, channel_bytes=100_000)
    fits = run_python("import os\nos.write(3, b'c' * 60_000)\nprint('x' * 5_000)", limits=limits, channels=1)
    assert fits.status == "ok" and fits.channels == [b"c" * 60_000] and len(fits.stdout) == 5_001
    flood = run_python("import os\nwhile True:\n    os.write(3, b'c' * 10_000)", limits=limits, channels=1)
    assert flood.status == "error" and len(flood.channels[0]) == 100_000
    assert "output limit of 100000 bytes exceeded on data channel 0" in flood.stderr
    loud = run_python("print('x' * 20_000)", limits=limits, channels=1)
    assert loud.status == "error" and len(loud.stdout) == 10_000
    assert "output limit of 10000 bytes exceeded; program stopped" in loud.stderr


def test_the_weak_supervisor_keeps_stdout_to_output_bytes():
    from gyre.rewards.sandbox import weak

    limits = SandboxLimits(cpu_s=2, wall_s=5.0, memory_mb=256, output_bytes=10_000, channel_bytes=100_000)
    assert weak.run_weak("print('x' * 5_000)", "", limits, True, 0).stdout == "x" * 5_000 + "\n"
    loud = weak.run_weak("print('x' * 20_000)", "", limits, True, 0)
    assert loud.status == "error" and len(loud.stdout) == 10_000 and "output limit of 10000 bytes" in loud.stderr


def test_a_remote_server_clamps_the_channel_cap_like_the_others():
    from gyre.rewards.sandbox.remote import ServerLimits, _clamp

    caps = ServerLimits(SandboxLimits(channel_bytes=2_000_000))
    assert _clamp({"channel_bytes": 0}, caps).channel_bytes == 1024
    assert _clamp({"channel_bytes": 10**12}, caps).channel_bytes == 2_000_000
    assert _clamp({}, caps).channel_bytes == SandboxLimits().channel_bytes


def test_the_weak_supervisor_hands_its_data_channels_and_nothing_else_to_the_program(tmp_path):
    from gyre.rewards.sandbox import weak

    kept = open(tmp_path / "parent.txt", "w")  # an inheritable descriptor of the parent's: not the program's
    fd = kept.fileno()
    os.set_inheritable(fd, True)
    program = "import os\nos.write(3, b'one')\nos.write(4, b'two')\nprint(' '.join(os.listdir('/proc/self/fd')))"
    try:
        out = weak.run_weak(program, "", SandboxLimits(), False, 2)
    finally:
        kept.close()
    assert out.status == "ok", out.stderr
    assert out.channels == [b"one", b"two"]
    assert fd <= 4 or str(fd) not in out.stdout.split()
