"""Run untrusted Python source (model-written programs) in a sandbox on this machine: the supervisor.

Code rewards execute whatever a policy writes, and a policy under RL pressure finds every shortcut: an
infinite loop, a fork bomb, a daemon that outlives its test, reading the expected outputs, filling the
disk, calling home. The containment is the kernel's, so it holds even where the program defeats the
Python layer (the tests switch that layer off and run every attack again):

a) Kernel (``nsinit.py``): new PID, mount, network, IPC and UTS namespaces; a new root on a tmpfs that
   holds only the Python installation and its shared libraries (read-only), four /dev nodes, a private
   /proc and a size- and inode-limited tmpfs work directory; a dedicated uid per run (root) or a user
   namespace (not root); rlimits (CPU, address space, file size, processes, descriptors, no core);
   ``PR_SET_NO_NEW_PRIVS`` and a seccomp filter (``seccomp.py``). When the program exits, or the
   stub is killed, the namespace's init exits and the kernel kills every process left in it; the
   tmpfs goes with it. The death signals chain supervisor -> stub -> init, so even a supervisor killed
   on a reward worker's deadline takes the whole sandbox with it.
b) Python (``boot.py``, defence in depth): an audit hook that ends the program on process creation,
   sockets, ctypes, code-object construction and file access outside its directory.
c) Supervisor (here): a wall-clock deadline, output caps (a flood ends the run), and the outcome.

Where the kernel lacks namespaces (not root and no user namespaces, or not Linux), only rlimits, a
process group and the Python layer remain: that is not containment, so ``run_python`` refuses to run
there unless the caller passes ``allow_weak=True`` (``reward.domains.<name>.sandbox.allow_weak``).
``sandbox_capabilities()`` reports which layers this machine gives.

The interpreter runs as ``python -I -S -B -X utf8``: isolated from the environment and user site,
without ``site`` (only the standard library; ~2x faster start-up, which matters at one process per test
case), and without writing bytecode.

Data channels: with ``channels=k`` the program gets k extra pipes as file descriptors 3 .. 3+k-1, and
``RunOutcome.channels`` holds what it wrote to each, at most ``SandboxLimits.channel_bytes`` of each (the
code reward sends results through them, so they are compared outside the sandbox).
"""

from __future__ import annotations

import functools
import inspect
import marshal
import math
import os
import resource
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Literal

from gyre.rewards.sandbox import boot, nsinit, rootfs, seccomp
from gyre.rewards.sandbox.boot import BLOCKED_MARKER, EXIT_BLOCKED, EXIT_MEMORY, MEMORY_MARKER

Status = Literal["ok", "error", "timeout", "memory", "killed", "blocked"]

UID_BASE = 2_000_000_000
"""Per-run uids (root mode) are UID_BASE + a salt + the stub's pid: unique among this machine's live
stubs (the pid), and unlikely to meet a stub of another container on the same host (the salt: pids
repeat across PID namespaces, and runs sharing a uid would share its process limit)."""
_UID_SALT = int.from_bytes(os.urandom(2), "little") % 34 << 22
"""Per supervisor process; pids stay below 2**22 (pid_max), and UID_BASE + 34 * 2**22 < 2**31."""
_USERNS_UID = 1000
_GRACE_S = 1.0
"""How long output is still drained after the sandbox ended."""
_WORK = "/work"


class SandboxUnavailable(RuntimeError):
    """This machine cannot contain untrusted code (and weak containment was not accepted)."""


@dataclass(frozen=True)
class SandboxLimits:
    cpu_s: float = 5.0
    """CPU seconds (RLIMIT_CPU, rounded up to whole seconds)."""
    wall_s: float = 10.0
    """Wall-clock seconds before the sandbox is killed."""
    memory_mb: int = 512
    """Address space (RLIMIT_AS); also the stack limit, so deep recursion is bounded by memory only."""
    file_size_mb: int = 16
    """Largest file the program may write (RLIMIT_FSIZE)."""
    disk_mb: int = 64
    """Size of the work directory's tmpfs: all files together (memory, released when the run ends)."""
    files: int = 4096
    """Files and directories the work directory may hold (tmpfs inodes)."""
    processes: int = 0
    """Extra processes or threads allowed (RLIMIT_NPROC of the run's own uid)."""
    output_bytes: int = 1_000_000
    """Bytes of stdout and of stderr kept (each); a program that writes more is stopped."""
    channel_bytes: int = 1_000_000
    """Bytes of each data channel kept; a program that writes more is stopped."""
    allow_read: tuple[str, ...] = ()
    """Extra host paths the program may read (bind-mounted read-only at their own paths)."""


@dataclass
class RunOutcome:
    status: Status
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    """Wall-clock seconds from start to exit (interpreter start-up included) or to the kill."""
    pid: int | None = None
    """The host pid of the sandbox's outermost process (the stub; the program itself in weak mode)."""
    uid: int | None = None
    """The uid the program ran as (host view)."""
    channels: list[bytes] = field(default_factory=list)
    """What the program wrote to each data channel (fds 3, 4, ...)."""


@functools.lru_cache(maxsize=1)
def _boot_source() -> str:
    return inspect.getsource(boot)


@functools.lru_cache(maxsize=1)
def _init_source() -> str:
    return inspect.getsource(nsinit) + "\n\nimport sys\nmain(int(sys.argv[1]))\n"


def _rlimits(limits: SandboxLimits, mode: str = "root") -> list[tuple[int, int, int]]:
    """The program's rlimits. RLIMIT_NPROC counts the processes of its uid: the program alone with a
    per-run uid (root mode); in a user namespace the stub and init share its uid, so they count too."""
    nproc = 1 + limits.processes + (2 if mode == "userns" else 0)
    mem = limits.memory_mb << 20
    cpu = max(1, math.ceil(limits.cpu_s))
    fsize = min(limits.file_size_mb, limits.disk_mb) << 20
    return [(resource.RLIMIT_CPU, cpu, cpu + 1),  # SIGXCPU first, SIGKILL one second later
            # a core limit of 1 (not 0) also stops core dumps piped to a host helper (core(5))
            (resource.RLIMIT_AS, mem, mem), (resource.RLIMIT_FSIZE, fsize, fsize), (resource.RLIMIT_CORE, 1, 1),
            (resource.RLIMIT_NOFILE, 64, 64), (resource.RLIMIT_STACK, mem, mem),
            (resource.RLIMIT_NPROC, nproc, nproc)]


def _program_argv(cfg: dict) -> list[str]:
    return [rootfs.interpreter(), "-I", "-S", "-B", "-X", "utf8", "-c", f"{_boot_source()}\n\nmain({cfg!r})\n"]


def _boot_config(work: str, solution: str, stdin_path: str, limits: SandboxLimits, audit: bool,
                 isolate: bool = False) -> dict:
    # An isolated run's stdin holds the test's text, for the test's process alone: not to be opened again.
    readable = [*rootfs.DEVICES, *([] if isolate else [stdin_path]), *(os.path.realpath(p) for p in limits.allow_read)]
    return {"solution": solution, "filename": "solution.py", "work": work, "audit": audit, "readable": readable,
            "isolate": isolate}


def _env(work: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "HOME": work, "TMPDIR": work}


def _staging(plan: tuple) -> str:
    """A host directory to mount the new root on (in the private mount namespace only); one that no
    bound path lives under."""
    sources = [entry[1] for entry in plan]
    for candidate in ("/mnt", "/media", "/srv", "/opt", "/tmp"):
        if os.path.isdir(candidate) and not os.path.islink(candidate) and \
                not any(s == candidate or s.startswith(candidate + "/") for s in sources):
            return candidate
    raise SandboxUnavailable("no directory to build the sandbox root on (tried /mnt, /media, /srv, /opt, /tmp)")


def _ns_config(mode: str, source: str, stdin: str, limits: SandboxLimits, audit: bool, filtered: bool,
               isolate: bool = False) -> dict:
    plan = rootfs.root_plan(tuple(limits.allow_read))
    body = len(source.encode()) + len(stdin.encode())
    cfg = {
        "mode": mode, "supervisor": os.getpid(), "uid_base": UID_BASE + _UID_SALT, "uid": _USERNS_UID,
        "outer_uid": os.geteuid(), "outer_gid": os.getegid(), "plan": [list(e) for e in plan],
        "staging": _staging(plan), "root_kb": 1024 + 2 * body // 1024, "disk_kb": limits.disk_mb * 1024,
        "inodes": limits.files, "proc": True, "solution.py": source, "stdin": stdin,
        "rlimits": _rlimits(limits, mode), "env": _env(_WORK),
        "seccomp": _seccomp_b64() if filtered else None,
    }
    cfg["argv"] = _program_argv(_boot_config(_WORK, "/sandbox/solution.py", "/sandbox/stdin", limits, audit, isolate))
    return cfg


@functools.lru_cache(maxsize=1)
def _seccomp_b64() -> str:
    import base64

    return base64.b64encode(seccomp.build_filter()).decode()


class _Streams:
    """stdout, stderr, the data channels and the status pipe, read as they come; at most ``limit`` bytes
    of stdout and of stderr kept, ``channel_limit`` of each data channel (the status pipe is ours and small)."""

    def __init__(self, fds: dict[str, int], limit: int, channel_limit: int):
        self.fds = fds
        self.names = {fd: name for name, fd in fds.items()}
        self.limits = {fd: limit if name in ("stdout", "stderr") else channel_limit for name, fd in fds.items()
                       if name != "status"}
        self.bufs = {fd: bytearray() for fd in fds.values()}
        self.sel = selectors.DefaultSelector()
        for fd in self.bufs:
            self.sel.register(fd, selectors.EVENT_READ)
        self.over: str | None = None
        """The stream that overflowed first (stdout, stderr, ch0, ...)."""

    def read(self, timeout: float) -> list[int]:
        """Read what is ready; returns the other descriptors that became ready (e.g. a pidfd)."""
        other = []
        for key, _ in self.sel.select(max(0.0, timeout)):
            if key.fd not in self.bufs:
                other.append(key.fd)
                continue
            chunk = os.read(key.fd, 1 << 16)
            if not chunk:
                self.sel.unregister(key.fd)
                continue
            buf = self.bufs[key.fd]
            room = self.limits[key.fd] - len(buf) if key.fd in self.limits else len(chunk)
            buf += chunk[:room]
            if len(chunk) > room and self.over is None:
                self.over = self.names[key.fd]
        return other

    @property
    def overflow(self) -> bool:
        return self.over is not None

    def open(self) -> bool:
        return any(fd in self.sel.get_map() for fd in self.bufs)

    def get(self, name: str) -> bytes:
        return bytes(self.bufs[self.fds[name]])

    def close(self, proc: subprocess.Popen) -> None:
        """Close every descriptor: the process's pipes through their file objects, ours directly."""
        self.sel.close()
        proc.stdout.close()
        proc.stderr.close()
        for name, fd in self.fds.items():
            if name not in ("stdout", "stderr"):
                os.close(fd)


def _watch(streams: _Streams, pid: int, deadline: float) -> str | None:
    """Read output until ``pid`` exits; returns "timeout" or "output" if the run had to be stopped."""
    try:
        pidfd = os.pidfd_open(pid)
        streams.sel.register(pidfd, selectors.EVENT_READ)
    except (AttributeError, OSError):
        pidfd = None
    try:
        while not _exited(pid):
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            streams.read(left if pidfd is not None else min(left, 0.02))
            if streams.overflow:
                return "output"
        return None
    finally:
        if pidfd is not None:
            streams.sel.unregister(pidfd)
            os.close(pidfd)


def _exited(pid: int) -> bool:
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _drain(streams: _Streams) -> None:
    until = time.monotonic() + _GRACE_S
    while streams.open() and not streams.overflow and time.monotonic() < until:
        streams.read(until - time.monotonic())


def _wait_gone(pid: int | None, timeout: float = 5.0) -> None:
    """Block until process ``pid`` (not our child: the namespace's init) has exited; its exit completes
    only after every other process of its PID namespace is gone."""
    if pid is None:
        return
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, ProcessLookupError, OSError):
        return
    try:
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        sel.select(timeout)
        sel.close()
    finally:
        os.close(fd)


def _status_records(raw: bytes) -> dict:
    """The stub's and init's records (length-prefixed marshal: see ``nsinit.report``), merged."""
    out: dict = {}
    pos = 0
    while pos + 4 <= len(raw):
        size = int.from_bytes(raw[pos:pos + 4], "little")
        try:
            record = marshal.loads(raw[pos + 4:pos + 4 + size])
        except (EOFError, ValueError, TypeError):
            break
        if isinstance(record, dict):
            out.update(record)
        pos += 4 + size
    return out


def _run_namespaced(mode: str, source: str, stdin: str, limits: SandboxLimits, audit: bool, channels: int,
                    filtered: bool, isolate: bool = False) -> RunOutcome:
    cfg = _ns_config(mode, source, stdin, limits, audit, filtered, isolate)
    status_r, status_w = os.pipe()
    pipes = [os.pipe() for _ in range(channels)]
    cfg["status_fd"], cfg["channel_fds"] = status_w, [w for _, w in pipes]
    cfg_fd = os.memfd_create("gyre-sandbox-config")
    os.write(cfg_fd, marshal.dumps(cfg))
    passed = (cfg_fd, status_w, *cfg["channel_fds"])
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            [rootfs.interpreter(), "-I", "-S", "-B", "-c", _init_source(), str(cfg_fd)], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={}, pass_fds=passed, start_new_session=True)
    except BaseException:
        for fd in (status_r, *(r for r, _ in pipes)):
            os.close(fd)
        raise
    finally:
        for fd in passed:
            os.close(fd)
    fds = {"stdout": proc.stdout.fileno(), "stderr": proc.stderr.fileno(), "status": status_r,
           **{f"ch{i}": r for i, (r, _) in enumerate(pipes)}}
    streams = _Streams(fds, limits.output_bytes, limits.channel_bytes)
    try:
        reason = _watch(streams, proc.pid, start + limits.wall_s)
        seconds = time.monotonic() - start
        _kill(proc.pid)  # the stub; init and with it the namespace follow (death signals)
        _drain(streams)
        reason = reason or ("output" if streams.overflow else None)  # a flood seen only while draining
        proc.wait()
        status = _status_records(streams.get("status"))
        _wait_gone(status.get("init_pid"))
        return _outcome(status, reason, seconds, streams, channels, limits, proc.pid)
    finally:
        streams.close(proc)


def _kill(pid: int) -> None:
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _outcome(status: dict, reason: str | None, seconds: float, streams: _Streams, channels: int,
             limits: SandboxLimits, pid: int) -> RunOutcome:
    if "setup_error" in status:
        raise SandboxUnavailable(f"the sandbox could not start: {status['setup_error']}")
    stdout = streams.get("stdout").decode("utf-8", "replace")
    stderr = streams.get("stderr").decode("utf-8", "replace")
    rc = os.waitstatus_to_exitcode(status["status"]) if "status" in status else None
    if rc is None and reason is None:  # the program never ran: the stub or init failed
        raise SandboxUnavailable(f"the sandbox ended before the program ran: {stderr[-500:]}")
    if reason == "output":
        on_channel = (streams.over or "").startswith("ch")
        where = f" on data channel {streams.over[2:]}" if on_channel else ""
        stderr += (f"\n[gyre-sandbox] output limit of {limits.channel_bytes if on_channel else limits.output_bytes} "
                   f"bytes exceeded{where}; program stopped")
    elif reason == "timeout":
        stderr += f"\n[gyre-sandbox] wall-clock limit of {limits.wall_s}s exceeded; program killed"
    verdict = classify(rc, reason, stderr, status.get("cpu_s", 0.0), limits)
    return RunOutcome(verdict, rc, stdout, stderr, seconds, pid=pid, uid=status.get("uid"),
                      channels=[streams.get(f"ch{i}") for i in range(channels)])


def classify(rc: int | None, reason: str | None, stderr: str, cpu: float, limits: SandboxLimits) -> Status:
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
    return "killed" if rc is not None and rc < 0 else "error"


def run_python(source: str, stdin: str = "", limits: SandboxLimits | None = None, *, audit_hook: bool = True,
               channels: int = 0, allow_weak: bool = False, isolate: bool = False) -> RunOutcome:
    """Run ``source`` as a Python program with ``stdin`` as its standard input, inside every sandbox
    layer this machine supports (see the module docstring and ``sandbox_capabilities``).

    ``audit_hook=False`` leaves out the Python layer; tests use it to show the kernel layers hold alone.
    ``isolate=True``: ``source`` is an isolated test (JSON, see ``boot.isolated``), run in two processes
    (``limits.processes`` must allow the second) with its verdict on channel 0. A weak sandbox refuses
    it (status "error"): there a program can reach the other process, so no verdict would be sound.
    Raises ``SandboxUnavailable`` when the machine cannot contain the program (no namespaces) and
    ``allow_weak`` is False, or when the sandbox itself fails to start; never for what the program does.
    Call it from a thread that outlives the run: the sandbox dies with the thread that started it.
    """
    from gyre.rewards.sandbox import probe, weak

    limits = limits or SandboxLimits()
    caps = probe.capabilities()
    if caps.mode == "weak":
        if not allow_weak:
            raise SandboxUnavailable(caps.refusal())
        return weak.run_weak(source, stdin, limits, audit_hook, channels, isolate)
    return _run_namespaced(caps.mode, source, stdin, limits, audit_hook, channels, caps.seccomp, isolate)


def sandbox_capabilities() -> dict:
    """Which sandbox layers this machine gives (probed once per process by running tiny programs)."""
    from gyre.rewards.sandbox import probe

    return probe.capabilities().as_dict()


