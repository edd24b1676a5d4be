"""Run untrusted Python source (model-written programs) in a sandbox and report what happened.

Code rewards execute whatever a policy writes, and a policy under RL pressure finds every shortcut: an
infinite loop, a fork bomb, reading the expected outputs, writing over the grader, calling home. One
layer of protection is not enough, so ``run_python`` stacks three, each of which holds on its own
(the tests switch the Python layer off to check that the kernel layers still contain a program):

a) Kernel (the security boundary).
   - rlimits set in the child before ``exec``: CPU seconds (SIGXCPU, then SIGKILL), address space
     (allocations fail with MemoryError instead of the host running out of memory), file size, core
     dumps off, a few file descriptors, and RLIMIT_NPROC (no fork, no threads beyond ``processes``).
   - When run as root, privileges are dropped to a fresh unprivileged uid/gid per run (2_000_000_000
     plus the child's pid): root-only files become unreadable, RLIMIT_NPROC applies (root ignores it),
     and concurrent sandboxes cannot signal or ptrace each other (with one shared ``nobody`` they could,
     and they would share one NPROC budget).
   - A new network namespace (``unshare(CLONE_NEWNET)``) leaves the program no network interface at all.
   - A new mount namespace makes the whole file system read-only except the program's own directory
     (world-writable /tmp and /dev/shm included); it also bind-mounts the Python installation into the
     sandbox directory when the unprivileged uid could not reach it otherwise (e.g. pyenv under /root).
   - ``PR_SET_NO_NEW_PRIVS`` (no privilege gain through set-uid binaries) and ``PR_SET_PDEATHSIG`` (the
     program dies with the process that started it, e.g. a reward worker killed on its own timeout).
   Namespaces need CAP_SYS_ADMIN, which some containers withhold: ``sandbox_capabilities()`` probes
   once per process which layers work here, and the missing ones are skipped (and reported there).
b) Python (defence in depth; PEP 578 itself warns that audit hooks are not a sandbox on their own).
   A bootstrap installs a ``sys.addaudithook`` hook before the program runs (hooks cannot be removed).
   It ends the program at once (exit code 113, a marker on stderr: status "blocked") on socket use,
   process creation or signalling, ctypes, code-object construction, interpreter introspection that
   could tamper with the hook (gc referrers, settrace, sub-interpreters), and any file access outside
   the allowed paths: reads from the sandbox directory, the standard library (``sys.path``), /dev/null,
   /dev/zero, /dev/urandom, /dev/random, its stdin, its own /proc entry and ``SandboxLimits.allow_read``;
   writes only inside the sandbox directory; directories may be listed but never opened (a directory
   descriptor would let ``dir_fd=`` calls resolve paths the hook never saw; so ``shutil.rmtree`` and
   ``TemporaryDirectory`` clean-up are refused too). Paths are resolved by the
   hook itself, with functions captured before the program runs, so monkeypatching ``os`` cannot fool it.
c) Process. A new session and process group, a fresh temporary directory as the working directory
   (removed afterwards), a scrubbed environment, stdin from a file, stdout/stderr through pipes with at
   most ``output_bytes`` kept (a flood ends the run), and the whole group killed with SIGKILL on the
   wall-clock deadline and again when the program exits, so no grandchild outlives it.

The interpreter runs as ``python -I -S -B -X utf8``: isolated from the environment and user site
(``-I``), without ``site`` (``-S``: only the standard library is importable, and start-up is ~2x
faster, which matters at one process per test case), and without writing bytecode caches (``-B``).

Known gaps: see ``code.py`` for reward-hacking gaps of assert-style tests. Here, a program that
constructs bytecode through ``marshal`` could corrupt interpreter memory and get past the Python layer;
the kernel layers are what hold then. World-readable host files (/etc/passwd) are readable as far as
the kernel layers go; only the Python layer refuses them. Without root or namespaces only rlimits, the
process group and the Python layer remain (``sandbox_capabilities()`` says which); then, with
``processes > 0``, a child that calls ``setsid`` could outlive the group kill (with a per-run uid, every
process of that uid is killed).
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import math
import os
import re
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from typing import Literal

from gyre.rewards import sandbox_boot
from gyre.rewards.sandbox_boot import BLOCKED_MARKER, EXIT_BLOCKED, EXIT_MEMORY, MEMORY_MARKER

Status = Literal["ok", "error", "timeout", "memory", "killed", "blocked"]

_UID_BASE = 2_000_000_000
_GRACE_S = 1.0
"""How long output is still drained after the process group was killed."""

# Linux constants (sched.h, sys/mount.h, sys/prctl.h); ctypes has no headers to read them from.
_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_NOATIME, _MS_NODIRATIME, _MS_BIND, _MS_REC = 32, 1024, 2048, 4096, 16384
_MS_PRIVATE, _MS_RELATIME = 1 << 18, 1 << 21
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38

_DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")


@dataclass(frozen=True)
class SandboxLimits:
    cpu_s: float = 5.0
    """CPU seconds (RLIMIT_CPU, rounded up to whole seconds)."""
    wall_s: float = 10.0
    """Wall-clock seconds before the process group is killed."""
    memory_mb: int = 512
    """Address space (RLIMIT_AS); also the stack limit, so deep recursion is bounded by memory only."""
    file_size_mb: int = 16
    """Largest file the program may write (RLIMIT_FSIZE)."""
    processes: int = 0
    """Extra processes or threads allowed (RLIMIT_NPROC; enforced when not root or after dropping root)."""
    output_bytes: int = 1_000_000
    """Bytes of stdout and of stderr kept; a program that writes more is stopped (status "error")."""
    allow_read: tuple[str, ...] = ()
    """Extra paths the program may read (the Python layer); they must also be readable by an unprivileged uid."""


@dataclass
class RunOutcome:
    status: Status
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    """Wall-clock seconds from start to exit (interpreter start-up included) or to the kill."""
    pid: int | None = None
    """The program's pid, also its process group and session id."""
    uid: int | None = None
    """The uid it ran as."""


@dataclass(frozen=True)
class _Layers:
    """Kernel layers to apply; chosen once per process by probing (``sandbox_capabilities``)."""

    drop: bool = False
    net: bool = False
    mount: bool = False
    bind_python: bool = False
    user_ns: bool = False
    no_new_privs: bool = False


@functools.lru_cache(maxsize=1)
def _boot_source() -> str:
    return inspect.getsource(sandbox_boot)


# Kernel layers, applied in the forked child between fork and exec. Everything they use is imported
# and loaded in the parent: an import in the child could wait forever on a lock another thread held.


@functools.lru_cache(maxsize=1)
def _libc():
    """libc with unshare/mount/prctl, loaded in the parent (never first in a forked child)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.unshare.argtypes = [ctypes.c_int]
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return libc


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _unshare(flags: int) -> None:
    if hasattr(os, "unshare"):  # Python >= 3.12
        os.unshare(flags)
    else:
        _check(_libc().unshare(flags), "unshare")


def _mount(source: str | None, target: str, flags: int) -> None:
    src = source.encode() if source else None
    _check(_libc().mount(src, target.encode(), None, flags, None), f"mount {target}")


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    return [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), p) for p in points]


def _readonly_view(root: str, work: str, python_prefix: str | None) -> None:
    """In the child's new mount namespace: everything read-only except ``work``; the Python install
    bind-mounted at ``root/python`` when the unprivileged uid cannot reach it where it is."""
    _mount(None, "/", _MS_REC | _MS_PRIVATE)  # nothing below propagates back to the host
    if python_prefix:
        _mount(python_prefix, os.path.join(root, "python"), _MS_BIND | _MS_REC)
    _mount(work, work, _MS_BIND)  # its own mount, so it stays writable when its parent goes read-only
    for point in _mount_points():
        if point == work:
            continue
        try:
            # A bind remount must repeat the flags it keeps (nosuid, nodev, ...) or it is refused.
            st = os.statvfs(point).f_flag
            keep = st & (_MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_NOATIME | _MS_NODIRATIME)
            keep |= _MS_RELATIME if st & os.ST_RELATIME else 0
            _mount(None, point, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | keep)
        except OSError:
            pass  # a mount hidden under another one; what it holds is still guarded by the uid
    os.chdir(work)  # the cwd set before the bind mount is the directory under it, now read-only


def _set_rlimits(limits: SandboxLimits, layers: _Layers) -> None:
    mem = limits.memory_mb << 20
    cpu = max(1, math.ceil(limits.cpu_s))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU first, SIGKILL one second later
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size_mb << 20,) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    try:
        resource.setrlimit(resource.RLIMIT_STACK, (mem, mem))
    except (ValueError, OSError):
        pass  # the hard limit is lower and only root could raise it: keep the inherited one
    if layers.drop:  # a fresh uid: its process count starts at this one process
        resource.setrlimit(resource.RLIMIT_NPROC, (1 + limits.processes,) * 2)
    elif os.geteuid() != 0 and limits.processes == 0:
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))  # the user's count is > 0: no fork, no thread


def _preexec(layers: _Layers, limits: SandboxLimits, root: str, work: str, parent: int):
    """The function Popen runs in the child between fork and exec (as root, when root is dropped)."""
    python_prefix = os.path.realpath(sys.base_prefix) if layers.bind_python else None
    if layers.net or layers.mount or layers.no_new_privs:
        _libc()

    def setup() -> None:
        if layers.drop:
            uid = _UID_BASE + os.getpid()
            os.chown(work, uid, uid)
        flags = (_CLONE_NEWNET if layers.net else 0) | (_CLONE_NEWNS if layers.mount else 0)
        if flags:
            _unshare(flags | (_CLONE_NEWUSER if layers.user_ns else 0))
        if layers.mount:
            _readonly_view(root, work, python_prefix)
        _set_rlimits(limits, layers)
        if layers.drop:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        if layers.no_new_privs:
            _check(_libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl")
            # set after the uid change, which clears it; then close the race with a parent already gone
            _check(_libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
            if os.getppid() != parent:
                os._exit(1)

    return setup


def _reachable_by_others(path: str) -> bool:
    """Whether a uid that is neither owner nor group can reach ``path`` (search bit on every ancestor)."""
    path = os.path.realpath(path)
    parts = path.split("/")
    for i in range(2, len(parts) + 1):
        if not os.stat("/".join(parts[:i]) or "/").st_mode & 0o001:
            return False
    return True


def _interpreter(layers: _Layers, root: str) -> tuple[str, dict[str, str]]:
    """The interpreter to exec and extra environment (the library path when it is bind-mounted)."""
    exe = os.path.realpath(sys.executable)
    if not layers.bind_python:
        return exe, {}
    prefix = os.path.realpath(sys.base_prefix)
    mapped = os.path.join(root, "python")
    env = {}
    libdir = os.path.realpath(sysconfig.get_config_var("LIBDIR") or "")
    if libdir.startswith(prefix + "/"):  # a shared libpython found through an absolute RUNPATH
        env["LD_LIBRARY_PATH"] = mapped + libdir[len(prefix):]
    return mapped + exe[len(prefix):], env


def _child_config(root: str, work: str, limits: SandboxLimits, audit: bool) -> dict:
    return {
        "solution": os.path.join(root, "solution.py"), "filename": "solution.py", "work": work, "audit": audit,
        # the stdin file too: /dev/stdin and /proc/self/fd/0 resolve to it
        "readable": [*_DEVICES, os.path.join(root, "stdin"), *(os.path.realpath(p) for p in limits.allow_read)],
    }


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_uid(uid: int) -> None:
    """Kill every process of a per-run uid: one that left the process group (setsid) dies too."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                owner = next((line.split()[1] for line in f if line.startswith("Uid:")), None)
            if owner == str(uid):
                os.kill(int(entry), signal.SIGKILL)
        except (OSError, ValueError):
            pass  # gone meanwhile


class _Output:
    """stdout and stderr of the program, read as they come, at most ``limit`` bytes of each kept."""

    def __init__(self, proc: subprocess.Popen, limit: int):
        self.limit = limit
        self.out_fd, self.err_fd = proc.stdout.fileno(), proc.stderr.fileno()
        self.bufs = {self.out_fd: bytearray(), self.err_fd: bytearray()}
        self.sel = selectors.DefaultSelector()
        for fd in self.bufs:
            self.sel.register(fd, selectors.EVENT_READ)
        self.overflow = False

    def read(self, timeout: float) -> None:
        for key, _ in self.sel.select(max(0.0, timeout)):
            if key.fd not in self.bufs:
                continue  # the pidfd: the caller checks for exit
            chunk = os.read(key.fd, 1 << 16)
            if not chunk:
                self.sel.unregister(key.fd)
                continue
            buf = self.bufs[key.fd]
            room = self.limit - len(buf)
            buf += chunk[:room]
            self.overflow |= len(chunk) > room

    def open(self) -> bool:
        return any(fd in self.sel.get_map() for fd in self.bufs)

    def text(self, fd: int) -> str:
        return self.bufs[fd].decode("utf-8", "replace")


def _exited(pid: int) -> bool:
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _supervise(proc: subprocess.Popen, limits: SandboxLimits, start: float, uid: int | None):
    """Wait for exit, the deadline or an output flood; kill the group; drain; reap. Returns
    (output, reason or None, seconds, returncode, cpu seconds)."""
    out = _Output(proc, limits.output_bytes)
    try:  # a pidfd wakes the select at exit; without one, poll
        pidfd = os.pidfd_open(proc.pid)
        out.sel.register(pidfd, selectors.EVENT_READ)
    except (AttributeError, OSError):
        pidfd = None
    deadline, reason = start + limits.wall_s, None
    while not _exited(proc.pid):
        left = deadline - time.monotonic()
        if left <= 0:
            reason = "timeout"
            break
        out.read(left if pidfd is not None else min(left, 0.02))
        if out.overflow:
            reason = "output"
            break
    seconds = time.monotonic() - start
    _kill_group(proc.pid)
    if uid is not None and limits.processes:
        _kill_uid(uid)
    drain_until = time.monotonic() + _GRACE_S
    while out.open() and not out.overflow and time.monotonic() < drain_until:
        out.read(drain_until - time.monotonic())
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    out.sel.close()
    if pidfd is not None:
        os.close(pidfd)
    proc.stdout.close()
    proc.stderr.close()
    return out, reason, seconds, proc.returncode, usage.ru_utime + usage.ru_stime


def _classify(rc: int, reason: str | None, stderr: str, cpu: float, limits: SandboxLimits) -> Status:
    if reason == "timeout":
        return "timeout"
    if reason == "output":
        return "error"
    if rc == 0:
        return "ok"
    if rc == EXIT_BLOCKED and BLOCKED_MARKER in stderr:
        return "blocked"
    if rc == EXIT_MEMORY and MEMORY_MARKER in stderr:
        return "memory"
    cpu_limit = max(1, math.ceil(limits.cpu_s))
    if rc == -signal.SIGXCPU or (rc == -signal.SIGKILL and cpu >= cpu_limit - 0.05):
        return "timeout"
    tail = stderr[-2000:]
    if "MemoryError" in tail or "Cannot allocate memory" in tail or "out of memory" in tail:
        return "memory"  # a failed allocation outside the program's own code (start-up, a C extension)
    return "killed" if rc < 0 else "error"


def _run(source: str, stdin: str, limits: SandboxLimits, layers: _Layers, audit: bool) -> RunOutcome:
    root = tempfile.mkdtemp(prefix="gyre-sbx-")
    try:
        os.chmod(root, 0o711)  # an unprivileged uid may pass through, not list
        work = os.path.join(root, "work")
        os.mkdir(work, 0o700)
        if layers.bind_python:
            os.mkdir(os.path.join(root, "python"), 0o755)
        with open(os.path.join(root, "solution.py"), "w", encoding="utf-8") as f:
            f.write(source)
        os.chmod(f.name, 0o644)  # read once by the bootstrap; the hook refuses it to the program
        with open(os.path.join(root, "stdin"), "w+b") as stdin_file:
            stdin_file.write(stdin.encode("utf-8"))
            stdin_file.seek(0)
            os.chmod(stdin_file.name, 0o644)  # open("/dev/stdin") reopens it as the sandbox uid
            exe, extra_env = _interpreter(layers, root)
            env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "HOME": work, "TMPDIR": work, **extra_env}
            boot = f"{_boot_source()}\n\nmain({_child_config(root, work, limits, audit)!r})\n"
            start = time.monotonic()
            proc = subprocess.Popen(
                [exe, "-I", "-S", "-B", "-X", "utf8", "-c", boot], stdin=stdin_file, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, cwd=work, env=env, start_new_session=True, close_fds=True,
                preexec_fn=_preexec(layers, limits, root, work, os.getpid()))
        uid = _UID_BASE + proc.pid if layers.drop else os.geteuid()  # the child chose it from its pid
        out, reason, seconds, rc, cpu = _supervise(proc, limits, start, uid if layers.drop else None)
        stdout, stderr = out.text(out.out_fd), out.text(out.err_fd)
        if reason == "output":
            stderr += f"\n[gyre-sandbox] output limit of {limits.output_bytes} bytes exceeded; program stopped"
        elif reason == "timeout":
            stderr += f"\n[gyre-sandbox] wall-clock limit of {limits.wall_s}s exceeded; program killed"
        status = _classify(rc, reason, stderr, cpu, limits)
        return RunOutcome(status, rc, stdout, stderr, seconds, pid=proc.pid, uid=uid)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_python(source: str, stdin: str = "", limits: SandboxLimits | None = None, *,
               audit_hook: bool = True) -> RunOutcome:
    """Run ``source`` as a Python program with ``stdin`` as its standard input, inside every sandbox
    layer this machine supports (see the module docstring and ``sandbox_capabilities``).

    ``audit_hook=False`` leaves out the Python layer; tests use it to show the kernel layers hold alone.
    Raises RuntimeError only when the sandbox itself cannot start, never for what the program does.
    The kernel layers are applied through Popen's ``preexec_fn``: call from a process's main thread, or
    from a process whose other threads do not hold locks across fork (reward workers are single-threaded).
    """
    limits = limits or SandboxLimits()
    layers = _probe()[0]
    try:
        return _run(source, stdin, limits, layers, audit_hook)
    except subprocess.SubprocessError as exc:
        raise RuntimeError(f"the sandbox could not start a program: {exc}") from exc


def _works(layers: _Layers) -> bool:
    """Whether a trivial program runs (as the expected uid) under these layers."""
    probe = "import posix\nprint(posix.getuid())"
    try:
        out = _run(probe, "", SandboxLimits(wall_s=10.0), layers, audit=True)
    except (OSError, subprocess.SubprocessError):
        return False
    # in a user namespace without a uid map the program sees the overflow uid, not its real one
    return out.status == "ok" and (layers.user_ns or out.stdout.strip() == str(out.uid))


@functools.lru_cache(maxsize=1)
def _probe() -> tuple[_Layers, dict]:
    """Find, once per process, the strongest set of kernel layers that works on this machine."""
    linux = sys.platform.startswith("linux")
    root = os.geteuid() == 0
    reachable = _reachable_by_others(sys.executable) and _reachable_by_others(sysconfig.get_paths()["stdlib"])
    net = mount = drop = bind = user_ns = nnp = False
    if linux:
        nnp = _works(_Layers(no_new_privs=True))
        user_ns = not root
        net = _works(_Layers(net=True, user_ns=user_ns))
        mount = root and _works(_Layers(mount=True))
        if root:
            bind = not reachable and mount
            drop = (reachable or bind) and _works(_Layers(drop=True, mount=mount, bind_python=bind))
        user_ns = user_ns and net
    layers = _Layers(drop=drop, net=net, mount=mount, bind_python=bind, user_ns=user_ns, no_new_privs=nnp)
    if not _works(layers):  # each works alone but not together: keep what is independent of the others
        layers = _Layers(no_new_privs=nnp)
    caps = {
        "platform": sys.platform, "root": root, "rlimits": True, "process_group": True, "audit_hook": True,
        "drop_privileges": layers.drop, "per_run_uid": layers.drop, "network_namespace": layers.net,
        "user_namespace": layers.user_ns, "mount_namespace_readonly_fs": layers.mount,
        "python_bind_mount": layers.bind_python, "no_new_privs": layers.no_new_privs,
        "parent_death_signal": layers.no_new_privs, "rlimit_nproc": layers.drop or not root,
        "pidfd": hasattr(os, "pidfd_open"),
    }
    return layers, caps


def sandbox_capabilities() -> dict:
    """Which sandbox layers are active in this process (probed once, by running tiny programs)."""
    return dict(_probe()[1])
