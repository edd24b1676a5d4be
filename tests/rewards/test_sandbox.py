"""The sandbox with real processes: normal programs, and each kind of escape contained.

Escape tests run twice where it matters: with every layer, and with the Python audit hook switched off
(``audit_hook=False``) to show the kernel layers hold on their own. Kernel-only checks that need a layer
this machine may lack (namespaces, dropping root) are skipped where ``sandbox_capabilities()`` says so.
After each escape attempt a normal program must still run.
"""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import time

import pytest

from gyre.rewards.sandbox import SandboxLimits, run_python, sandbox_capabilities
from gyre.rewards.sandbox_boot import resolve

LIMITS = SandboxLimits(cpu_s=2, wall_s=2.0, memory_mb=256)
CAPS = sandbox_capabilities()
BOTH = pytest.mark.parametrize("audit", [True, False], ids=["all-layers", "kernel-only"])


def still_works() -> None:
    out = run_python("print(6 * 7)", limits=LIMITS)
    assert (out.status, out.stdout) == ("ok", "42\n")


def live_processes(uid: int, pgid: int) -> list[str]:
    """Pids of ``uid`` or in group ``pgid`` that are not zombies (a killed orphan stays a zombie, and
    in its group, until init reaps it)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, _, group = f.read().rsplit(")", 1)[1].split()[:3]
            with open(f"/proc/{entry}/status") as f:
                mine = f"Uid:\t{uid}\t" in f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if state != "Z" and (int(group) == pgid or (mine and CAPS["per_run_uid"])):
            found.append(entry)
    return found


def assert_gone(out, orphans: bool = False) -> None:
    """No process of the run is left: not in its group, not (with a per-run uid) anything of its uid.
    Without ``orphans`` (children killed after their parent exited), the group must not exist at all."""
    if not orphans:
        with pytest.raises(ProcessLookupError):
            os.killpg(out.pid, 0)
    deadline = time.monotonic() + 1.0  # SIGKILL was sent; give the kernel a moment to finish the exits
    while live_processes(out.uid, out.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert live_processes(out.uid, out.pid) == []


def kernel_layer(name: str, audit: bool) -> None:
    if not audit and not CAPS[name]:
        pytest.skip(f"sandbox layer {name} is not available here")


def test_capabilities_report_each_layer():
    assert CAPS["rlimits"] and CAPS["audit_hook"] and CAPS["process_group"]
    assert {"drop_privileges", "network_namespace", "mount_namespace_readonly_fs"} <= CAPS.keys()
    assert all(isinstance(v, (bool, str)) for v in CAPS.values())


def test_program_reads_stdin_and_writes_stdout_in_its_own_dir():
    src = "import os\nprint(input()[::-1])\nopen('f', 'w').write('x')\nprint(os.listdir('.'))\n"
    out = run_python(src + "print(open('/dev/stdin').read())", "abc\ndef", LIMITS)
    assert out.status == "ok" and out.returncode == 0
    assert out.stdout == "cba\n['f']\nabc\ndef\n"
    assert out.seconds < LIMITS.wall_s


def test_errors_exit_codes_and_stdlib():
    out = run_python("def f():\n    raise KeyError(7)\nf()", limits=LIMITS)
    assert out.status == "error" and out.returncode == 1 and "KeyError: 7" in out.stderr
    assert "_child_main" not in out.stderr  # the traceback starts at the program
    out = run_python("x = (", limits=LIMITS)
    assert out.status == "error" and "SyntaxError" in out.stderr
    out = run_python("import sys\nprint('a')\nsys.exit(3)", limits=LIMITS)
    assert (out.status, out.returncode, out.stdout) == ("error", 3, "a\n")
    src = ("import asyncio, collections, heapq, json, re, random, typing, dataclasses, fractions\n"
           "async def f():\n    return collections.namedtuple('P', 'x')(1).x\nprint(asyncio.run(f()))")
    assert run_python(src, limits=LIMITS).stdout == "1\n"


def test_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv("GYRE_TEST_SECRET_TOKEN", "hunter2")
    out = run_python("import os\nprint(dict(os.environ))", limits=LIMITS)
    assert out.status == "ok" and "hunter2" not in out.stdout


def test_work_dir_is_removed_afterwards():
    out = run_python("import os\nprint(os.getcwd())\nopen('big', 'w').write('x' * 1000)", limits=LIMITS)
    assert out.status == "ok"
    assert not os.path.exists(os.path.dirname(out.stdout.strip()))


@BOTH
def test_infinite_loop_is_killed_on_the_wall_clock(audit):
    limits = SandboxLimits(cpu_s=10, wall_s=1.0)
    start = time.monotonic()
    out = run_python("while True:\n    pass", limits=limits, audit_hook=audit)
    assert out.status == "timeout" and time.monotonic() - start < limits.wall_s + 1.5
    assert_gone(out)
    still_works()


def test_cpu_limit_is_a_timeout():
    out = run_python("while True:\n    pass", limits=SandboxLimits(cpu_s=1, wall_s=10.0))
    assert out.status == "timeout" and out.returncode == -signal.SIGXCPU  # the CPU limit, not the wall clock
    out = run_python("import time\ntime.sleep(5)", limits=SandboxLimits(wall_s=0.5))  # sleeping uses no CPU
    assert out.status == "timeout" and out.seconds < 1.5


@BOTH
@pytest.mark.parametrize("bomb", [
    "import os\nwhile True:\n    os.fork()",
    "import subprocess, sys\nwhile True:\n    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])",
    "import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, args=(60,)).start()",
], ids=["fork", "subprocess", "threads"])
def test_fork_bombs_are_contained(bomb, audit):
    kernel_layer("rlimit_nproc", audit)  # without it, kernel-only would be a real fork bomb
    out = run_python(bomb, limits=LIMITS, audit_hook=audit)
    assert out.status in ("blocked", "error"), out
    if audit and "thread" not in bomb:
        assert out.status == "blocked"
    elif CAPS["rlimit_nproc"]:
        assert "Resource temporarily unavailable" in out.stderr or "can't start new thread" in out.stderr
    assert_gone(out)
    still_works()


def test_allowed_children_die_with_the_program_even_after_setsid():
    if not CAPS["per_run_uid"]:
        pytest.skip("needs a per-run uid to find processes that left the group")
    src = ("import os, time\nfor _ in range(2):\n    if os.fork() == 0:\n        os.setsid()\n        time.sleep(60)\n"
           "print('parent done')")
    out = run_python(src, limits=SandboxLimits(wall_s=2.0, processes=2), audit_hook=False)
    assert out.status == "ok" and out.stdout == "parent done\n"
    assert_gone(out, orphans=True)
    still_works()


@BOTH
@pytest.mark.parametrize("hog", ["x = bytearray(10**10)", "x = []\nwhile True:\n    x.append(bytearray(10**6))"],
                         ids=["one-huge", "growing"])
def test_memory_hogs_hit_the_address_space_limit(hog, audit):
    out = run_python(hog, limits=SandboxLimits(wall_s=5.0, memory_mb=128), audit_hook=audit)
    assert out.status in ("memory", "error"), out
    assert out.status == "memory"
    still_works()


@BOTH
def test_cannot_write_outside_its_directory(tmp_path, audit):
    if not audit and not (CAPS["drop_privileges"] or CAPS["mount_namespace_readonly_fs"]):
        pytest.skip("kernel-only: running as this user with a writable file system, nothing stops the write")
    target = tmp_path / "outside.txt"
    shared = tempfile.mkdtemp(prefix="gyre-test-")
    os.chmod(shared, 0o777)  # world-writable, like /tmp: the uid alone would not stop the write
    try:
        src = (f"import os\nfor p in [{str(target)!r}, {shared + '/x'!r}]:\n    try:\n"
               "        open(p, 'w').write('pwned')\n    except OSError as e:\n        print(e)\n"
               f"os.mkfifo({shared + '/fifo'!r})")
        out = run_python(src, limits=LIMITS, audit_hook=audit)
        assert out.status in ("blocked", "error")
        assert not target.exists()
        if audit or CAPS["mount_namespace_readonly_fs"]:
            assert os.listdir(shared) == []
    finally:
        for name in os.listdir(shared):
            os.unlink(os.path.join(shared, name))
        os.rmdir(shared)
    still_works()


@BOTH
def test_cannot_reach_a_local_server(audit):
    kernel_layer("network_namespace", audit)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    port = server.getsockname()[1]
    try:
        src = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\ns.sendall(b'hi')"
        out = run_python(src, limits=LIMITS, audit_hook=audit)
        assert out.status == ("blocked" if audit else "error"), out
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()
    still_works()


def test_socket_creation_is_blocked():
    for src in ["import socket\nsocket.socket()", "import socket\nsocket.getaddrinfo('example.com', 80)",
                "import _socket\n_socket.socket(2, 1)"]:
        out = run_python(src, limits=LIMITS)
        assert out.status == "blocked" and "socket." in out.stderr
    still_works()


@BOTH
def test_cannot_read_host_files(tmp_path, audit):
    kernel_layer("drop_privileges", audit)
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-4242")
    attempts = [f"print(open({str(secret)!r}).read())",
                f"import os\nos.symlink({str(secret)!r}, 'l')\nprint(open('l').read())",
                f"import os\nos.chdir({str(tmp_path)!r})\nprint(open('secret.txt').read())"]
    for src in attempts:
        out = run_python(src, limits=LIMITS, audit_hook=audit)
        assert "TOP-SECRET-4242" not in out.stdout + out.stderr
        assert out.status == "blocked" if audit else out.status == "error"
    still_works()


def test_python_layer_cannot_be_fooled_by_monkeypatching(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-4242")
    src = ("import os, posixpath, builtins\nos.path.realpath = posixpath.realpath = lambda p, **k: '/tmp/x'\n"
           "os.lstat = lambda p: None\nbuiltins.type = lambda o: str\n"
           f"print(open({str(secret)!r}).read())")
    out = run_python(src, limits=LIMITS)
    assert out.status == "blocked" and "TOP-SECRET" not in out.stdout
    for src in ["import os\nfd = os.open('.', os.O_RDONLY)",  # directory descriptors would defeat path checks
                "import gc\ngc.get_objects()", "import sys\nsys.settrace(lambda *a: None)",
                "import os\nos.kill(os.getppid(), 9)", "f = lambda: 0\nf.__code__.replace(co_name='g')"]:
        assert run_python(src, limits=LIMITS).status == "blocked", src
    still_works()


def test_allow_read_opens_only_the_listed_path():
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
        out = run_python(f"print(open({shared + '/other.txt'!r}).read())", limits=limits)
        assert out.status == "blocked" and "OTHER" not in out.stdout
    finally:
        for name in os.listdir(shared):
            os.unlink(os.path.join(shared, name))
        os.rmdir(shared)


@BOTH
def test_ctypes_bypass_is_blocked(audit, tmp_path):
    kernel_layer("rlimit_nproc", audit)
    marker = tmp_path / "ctypes-ran"
    src = f"import ctypes\nlibc = ctypes.CDLL(None)\nprint(libc.system(b'touch {marker}'))"
    out = run_python(src, limits=LIMITS, audit_hook=audit)
    if audit:
        assert out.status == "blocked"
    assert not marker.exists()  # kernel-only: ctypes loads, but libc's system() cannot fork
    still_works()


def test_output_flood_is_truncated_and_stopped():
    limits = SandboxLimits(wall_s=5.0, output_bytes=10_000)
    out = run_python("while True:\n    print('x' * 100)", limits=limits)
    assert out.status == "error" and len(out.stdout) <= 10_000 and out.stdout.startswith("x" * 100)
    assert "output limit" in out.stderr and out.seconds < 2.0
    assert_gone(out)
    still_works()


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
