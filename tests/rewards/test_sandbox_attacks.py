"""Hostile programs against the sandbox's kernel layers, with the Python audit hook switched off.

Every attack here runs with ``audit_hook=False`` (the kernel layers alone) unless it attacks the hook
itself. After each: no process of the run is alive, no directory appeared on the host, no file changed,
and a normal program still runs. Attacks come from the issue (daemons, host files, /tmp and /dev/shm,
a local listener, other processes' environments, the parent, disk filling, fork and thread bombs) and
from thinking like someone who wants out (hook bypass through a re-loaded extension module, ctypes
system calls, the Python installation, symbolic links, killing the supervisor mid-run).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time

import pytest

import gyre
from gyre.rewards.sandbox import SandboxLimits, SandboxUnavailable, run_python, sandbox_capabilities
from gyre.rewards.sandbox.local import _run_namespaced
from tests.rewards.sandbox_host import (
    assert_host_clean,
    host_changes,
    host_state,
    run_uid,
    sandbox_processes,
    stubs_of,
)

CAPS = sandbox_capabilities()
pytestmark = pytest.mark.skipif(CAPS["mode"] == "weak", reason=f"no kernel containment here: {CAPS['reason']}")
LIMITS = SandboxLimits(cpu_s=3, wall_s=3.0, memory_mb=256)
SPAWNING = SandboxLimits(cpu_s=3, wall_s=3.0, memory_mb=256, processes=4)
NOBODY = 65534
_CHECKOUT = os.path.dirname(os.path.dirname(gyre.__file__))
"""What a subprocess puts on its path to import this gyre (not the working directory: pytest may run elsewhere)."""


@pytest.fixture
def secret(tmp_path):
    """A world-readable file in a world-readable directory, like a data set holding expected outputs."""
    os.chmod(tmp_path, 0o755)
    path = tmp_path / "dataset.jsonl"
    path.write_text('{"expected": "TOP-SECRET-4242"}\n')
    path.chmod(0o644)
    return str(path)


def run_attack(src: str, *files: str, limits: SandboxLimits = LIMITS, audit: bool = False):
    before = host_state(*files)
    out = run_python(textwrap.dedent(src), limits=limits, audit_hook=audit)
    assert_host_clean(before, out.pid, out.uid)
    assert run_python("print(6 * 7)", limits=LIMITS).stdout == "42\n"  # the sandbox still works
    return out


def test_detached_session_daemon_dies_with_the_run(secret):
    out = run_attack(f"""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                while True:  # a daemon that keeps trying to write to the host
                    for p in ({secret!r}, '/tmp/gyre-daemon', '/root/gyre-daemon'):
                        try:
                            open(p, 'a').write('pwned')
                        except OSError:
                            pass
                    time.sleep(0.01)
            os._exit(0)
        time.sleep(0.2)
        print('parent done')
    """, secret, limits=SPAWNING)
    assert out.status == "ok" and out.stdout == "parent done\n"


def test_host_files_are_not_visible(secret):
    out = run_attack(f"""
        import os
        found = []
        for p in ({secret!r}, '/etc/passwd', '/etc/shadow', '/root', '/home', '/proc/1/root{secret}',
                  '/proc/1/environ', '/sys', {os.path.dirname(secret)!r}):
            try:
                found.append((p, open(p).read()[:50] if os.path.isfile(p) else os.listdir(p)))
            except OSError as e:
                found.append((p, type(e).__name__))
        os.symlink({secret!r}, 'link')
        try:
            found.append(open('link').read())
        except OSError as e:
            found.append(type(e).__name__)
        print(found)
        print(sorted(os.listdir('/')))
    """, secret)
    assert out.status == "ok", out.stderr
    assert "TOP-SECRET" not in out.stdout and "root:" not in out.stdout
    top = eval(out.stdout.splitlines()[1])  # noqa: S307 - our own program's printed list
    assert set(top) <= {"dev", "lib", "lib64", "usr", "proc", "sandbox", "tmp", "work", "root", "bin", "opt"}


def test_writes_to_tmp_shm_and_elsewhere_stay_inside():
    out = run_attack("""
        import os
        for p in ('/tmp/gyre-x', '/dev/shm/gyre-x', '/var/tmp/gyre-x', '/mnt/gyre-x', '/gyre-x', '/usr/gyre-x',
                  '/dev/gyre-x', '/sandbox/solution.py'):
            try:
                with open(p, 'w') as f:
                    f.write('pwned')
                print('wrote', p)
            except OSError as e:
                print(type(e).__name__, p)
    """)
    assert out.status == "ok"
    wrote = [line for line in out.stdout.splitlines() if line.startswith("wrote")]
    assert wrote == ["wrote /tmp/gyre-x"]  # /tmp is the run's own work directory


def test_python_installation_is_read_only():
    target = os.path.join(sysconfig.get_paths()["stdlib"], "os.py")
    out = run_attack(f"""
        for mode in ('a', 'w'):
            try:
                open({target!r}, mode).write('pwned')
                print('wrote')
            except OSError as e:
                print(type(e).__name__)
    """, target)
    assert "wrote" not in out.stdout


@pytest.mark.parametrize("filtered", [True, False], ids=["seccomp", "netns-only"])
def test_cannot_reach_a_local_listener(filtered):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    port = server.getsockname()[1]
    try:
        src = (f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\ns.sendall(b'hi')\n"
               "print('connected')")
        out = _run_namespaced(CAPS["mode"], src, "", LIMITS, False, 0, filtered and CAPS["seccomp"])
        assert out.status == "error" and "connected" not in out.stdout
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()


def test_other_processes_environments_are_not_visible(monkeypatch):
    monkeypatch.setenv("GYRE_TEST_SECRET_TOKEN", "hunter2")
    out = run_attack(f"""
        import os
        seen = []
        pids = ['{os.getpid()}', '1'] + [e for e in os.listdir('/proc') if e.isdigit()]
        for p in [f'/proc/{{e}}/environ' for e in pids]:
            try:
                seen.append(open(p, 'rb').read())
            except OSError as e:
                seen.append(type(e).__name__)
        print(seen, os.listdir('/proc'))
    """)
    assert out.status == "ok" and "hunter2" not in out.stdout


def test_cannot_kill_the_parent_or_anyone_else():
    me = os.getpid()
    out = run_attack(f"""
        import os, signal
        for target in (os.getppid(), 1, {me}, {os.getppid()}):
            try:
                os.kill(target, signal.SIGKILL)
            except OSError as e:
                print(target, type(e).__name__)
        print('still here')
    """)
    assert "still here" in out.stdout  # init ignores signals from inside; the supervisor is out of reach
    out = run_attack("import os, signal\nos.kill(-1, signal.SIGKILL)", limits=SPAWNING)
    assert "ProcessLookupError" in out.stderr  # nothing in its namespace but itself and init
    out = run_attack("import os, signal\nos.killpg(0, signal.SIGKILL)\nprint('unreachable')", limits=SPAWNING)
    assert out.status == "killed" and "unreachable" not in out.stdout  # it can only kill itself


def test_filling_the_disk_stops_at_the_quota():
    free = os.statvfs("/").f_bavail * os.statvfs("/").f_frsize
    limits = SandboxLimits(cpu_s=10, wall_s=10.0, disk_mb=16, files=500, file_size_mb=64)
    out = run_attack("""
        import os
        big = files = 0
        try:
            while True:
                with open(f'big{big}', 'wb') as f:
                    f.write(os.urandom(1 << 20))
                big += 1
        except OSError as e:
            print('big', big, type(e).__name__)
        try:
            while True:
                open(f'f{files}', 'w').close()
                files += 1
        except OSError as e:
            print('files', files, type(e).__name__)
    """, limits=limits)
    assert out.status == "ok", out.stderr
    big, files = (int(line.split()[1]) for line in out.stdout.splitlines())
    assert big <= 16 and files <= 500
    assert abs(os.statvfs("/").f_bavail * os.statvfs("/").f_frsize - free) < 64 << 20  # host disk untouched


@pytest.mark.parametrize("bomb", [
    "import os\nwhile True:\n    os.fork()",
    "import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, args=(60,)).start()",
    "import os, time\nwhile True:\n    if os.fork() == 0:\n        os.setsid()\n        time.sleep(60)",
], ids=["fork", "threads", "setsid-fork"])
def test_fork_and_thread_bombs_are_contained(bomb):
    out = run_attack(bomb, limits=SPAWNING)
    assert out.status == "error" and ("Resource temporarily unavailable" in out.stderr
                                      or "can't start new thread" in out.stderr), out


def test_python_layer_bypass_lands_in_the_namespace(secret):
    """The audit hook refuses _posixsubprocess by name; loaded under another name it starts a process
    with no hook at all. The kernel layers still hold: the fresh interpreter sees no host file."""
    out = run_attack(f"""
        import importlib.machinery, importlib.util, os, sys, time
        d = [p for p in sys.path if p.endswith('lib-dynload')][0]
        path = [os.path.join(d, f) for f in os.listdir(d) if f.startswith('_posixsubprocess')][0]
        loader = importlib.machinery.ExtensionFileLoader('pkg._posixsubprocess', path)
        mod = loader.create_module(importlib.util.spec_from_loader('pkg._posixsubprocess', loader))
        r, w = os.pipe()
        code = "import os; print('child', os.path.exists({secret!r}), os.listdir('/'))"
        args = [sys.executable.encode(), b'-c', code.encode()]
        mod.fork_exec(args, [args[0]], True, (), None, None, -1, -1, -1, -1, -1, -1, r, w, False, True, -1,
                      None, None, None, -1, None, False)
        time.sleep(0.5)
    """, secret, limits=SPAWNING, audit=True)
    assert "child False" in out.stdout, out  # the bypass worked, and found nothing
    assert "TOP-SECRET" not in out.stdout


def test_kernel_interfaces_are_refused():
    if not CAPS["seccomp"]:
        pytest.skip("no seccomp filter on this machine")
    out = run_attack("""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        keyctl = 250 if os.uname().machine == 'x86_64' else 219
        calls = {'unshare': lambda: libc.unshare(0x10000000),
                 'mount': lambda: libc.mount(b'none', b'/work', b'tmpfs', 0, None),
                 'ptrace': lambda: libc.ptrace(16, 1, 0, 0), 'chroot': lambda: libc.chroot(b'/work'),
                 'setns': lambda: libc.setns(0, 0), 'keyctl': lambda: libc.syscall(keyctl, 0)}
        for name, call in calls.items():
            rc = call()
            print(name, rc, ctypes.get_errno())
    """)
    for line in out.stdout.splitlines():
        name, rc, errno_ = line.split()
        assert int(rc) == -1 and int(errno_) == 1, line  # EPERM


def test_killing_the_supervisor_takes_the_sandbox_with_it():
    """A reward worker killed on its own deadline while a program (and a setsid daemon of its) runs:
    the death signals chain supervisor -> stub -> init, and the namespace dies with init."""
    before = host_state()
    script = textwrap.dedent("""
        import sys
        from gyre.rewards.sandbox import SandboxLimits, run_python
        src = "import os, time\\nif os.fork() == 0:\\n    os.setsid()\\n    time.sleep(60)\\ntime.sleep(60)"
        run_python(src, limits=SandboxLimits(wall_s=60, cpu_s=60, processes=2), audit_hook=False)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": _CHECKOUT})
    try:
        deadline = time.monotonic() + 30
        stubs: list[int] = []
        uid = None
        while time.monotonic() < deadline:  # stub, init, program and daemon all running
            stubs = stubs_of(proc.pid)
            uid = run_uid(stubs[0]) if stubs else None
            if uid is not None and len(sandbox_processes(stubs[0], uid)) >= 4:
                break
            time.sleep(0.05)
        assert stubs and uid is not None and len(sandbox_processes(stubs[0], uid)) >= 4
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert_host_clean(before, stubs[0], uid)
    finally:
        proc.kill()


def _reachable_by_anyone(path: str) -> bool:
    """Every directory from / to ``path`` may be entered by any user."""
    parts = os.path.realpath(path).split("/")
    return all(os.stat("/" + "/".join(parts[1:i])).st_mode & stat.S_IXOTH for i in range(1, len(parts) + 1))


@pytest.fixture(scope="module")
def readable_gyre():
    """A copy of the gyre package that any user can import, for programs run as ``nobody``: the checkout
    may sit in a private directory (mode 0700, as ``mktemp -d`` and many homes make), and its permissions
    are its owner's to set, not the tests'."""
    base = next((d for d in (tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm")
                 if os.path.isdir(d) and _reachable_by_anyone(d)), None)
    if base is None:
        pytest.skip("no temporary directory that another user can reach")
    root = tempfile.mkdtemp(prefix="gyre-readable-", dir=base)
    try:
        shutil.copytree(os.path.join(_CHECKOUT, "gyre"), os.path.join(root, "gyre"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        for here, _, files in os.walk(root):  # the copy is ours: whatever the umask or source modes were
            os.chmod(here, 0o755)
            for name in files:
                os.chmod(os.path.join(here, name), 0o644)
        yield root
    finally:
        shutil.rmtree(root)


def _as_nobody(script: str, pythonpath: str) -> dict:
    python = "/usr/bin/python3"
    if not os.path.exists(python) or os.geteuid() != 0:
        pytest.skip("needs root and a system python to run a sandbox as an unprivileged user")
    env = {"PYTHONPATH": pythonpath, "PATH": "/usr/bin:/bin"}
    out = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python, "-c", script],
                         capture_output=True, text=True, env=env, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_user_namespace_mode_contains_an_unprivileged_caller(secret, readable_gyre):
    script = textwrap.dedent(f"""
        import json
        from gyre.rewards.sandbox import SandboxLimits, run_python, sandbox_capabilities
        caps = sandbox_capabilities()
        src = "import os, socket\\nprint(os.path.exists({secret!r}), os.getpid(), os.listdir('/'))"
        out = run_python(src, limits=SandboxLimits(wall_s=5), audit_hook=False)
        print(json.dumps({{"mode": caps["mode"], "status": out.status, "stdout": out.stdout, "stderr": out.stderr}}))
    """)
    before = host_state(secret, uid=NOBODY)  # the program's files would be nobody's: the caller's uid
    result = _as_nobody(script, readable_gyre)
    if result["mode"] == "weak":
        pytest.skip("unprivileged user namespaces are off here")
    assert result["mode"] == "userns" and result["status"] == "ok", result
    assert result["stdout"].startswith("False 2 ")
    assert host_changes(before) == []


def test_weak_machines_refuse_untrusted_code_unless_accepted(readable_gyre):
    """Namespaces forbidden (by a seccomp filter on the caller, as some containers do): run_python refuses,
    and runs with the weak layers only when the caller accepts them."""
    if not CAPS["seccomp"]:
        pytest.skip("needs seccomp to forbid namespaces for the test")
    script = textwrap.dedent("""
        import ctypes, json, base64
        from gyre.rewards.sandbox import seccomp
        from gyre.rewards.sandbox import SandboxUnavailable, run_python, sandbox_capabilities
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
        code = seccomp.build_filter()
        class Prog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
        prog = Prog(len(code) // 8, code)
        assert libc.prctl(38, 1, 0, 0, 0) == 0 and libc.prctl(22, 2, ctypes.addressof(prog), 0, 0) == 0
        try:
            run_python("print(1)")
            refused = ""
        except SandboxUnavailable as exc:
            refused = str(exc)
        out = run_python("print(6 * 7)", allow_weak=True)
        print(json.dumps({"mode": sandbox_capabilities()["mode"], "refused": refused, "weak": out.stdout}))
    """)
    result = _as_nobody(script, readable_gyre)
    assert result["mode"] == "weak"
    assert "refuses to run untrusted code" in result["refused"] and "allow_weak" in result["refused"]
    assert result["weak"] == "42\n"



@pytest.fixture
def sandbox_server():
    import threading

    from gyre.rewards.sandbox.remote import ServerLimits, make_server

    caps = ServerLimits(SandboxLimits(wall_s=2.0, cpu_s=2.0), concurrent=2)
    server = make_server("127.0.0.1", 0, token="s3cret", caps=caps)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_remote_sandbox_runs_programs_behind_the_same_interface(sandbox_server, secret, monkeypatch):
    from gyre.rewards.code import code_reward
    from gyre.rewards.sandbox.remote import run_remote

    out = run_remote(sandbox_server, "import os\nos.write(3, b'x')\nprint(input())", "hi",
                     SandboxLimits(wall_s=100.0), channels=1, token="s3cret")
    assert (out.status, out.stdout, out.channels) == ("ok", "hi\n", [b"x"])
    slow = run_remote(sandbox_server, "while True:\n    pass", limits=SandboxLimits(wall_s=100.0, cpu_s=100),
                      token="s3cret")
    assert slow.status == "timeout" and slow.seconds < 4.0  # the server's own cap (2 s) wins
    with pytest.raises(SandboxUnavailable, match="HTTP 401"):
        run_remote(sandbox_server, "print(1)", token="wrong")
    with pytest.raises(SandboxUnavailable, match="cannot be reached"):
        run_remote("http://127.0.0.1:1", "print(1)")
    monkeypatch.setenv("GYRE_TEST_SANDBOX_TOKEN", "s3cret")
    gt = json.dumps({"asserts": ["assert add(1, 2) == 3"]})
    options = {"url": sandbox_server, "token_env": "GYRE_TEST_SANDBOX_TOKEN"}
    response = "```python\ndef add(a, b):\n    return a + b\n```"
    assert code_reward(response, gt, timeout_s=2.0, sandbox=options).score == 1.0
    snoop = f"```python\ndef add(a, b):\n    return open({secret!r}).read()\n```"
    result = code_reward(snoop, gt, timeout_s=2.0, sandbox=options)
    assert result.score == 0.0 and "TOP-SECRET" not in json.dumps(result.info)
