"""Weak mode: a program run with rlimits, its own process group and the Python audit hook, on a
machine without namespaces. Not containment (the program sees the host's files as the caller's uid
and a ``setsid`` child can outlive the run); used only when the user accepted it explicitly."""

from __future__ import annotations

import fcntl
import os
import resource
import shutil
import subprocess
import tempfile
import time

from gyre.rewards.sandbox import local


def _preexec(limits: local.SandboxLimits, channel_fds: list[int]):
    rlimits = local._rlimits(limits)

    def setup() -> None:
        # The channels become fds 3, 4, ... and nothing else is inherited: this does close_fds' job here,
        # since close_fds runs after preexec_fn and would close them again.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 256) for fd in channel_fds]
        for i, fd in enumerate(high):
            os.dup2(fd, 3 + i, inheritable=True)
        for name in os.listdir("/proc/self/fd"):
            if int(name) >= 3 + len(high):
                try:
                    os.set_inheritable(int(name), False)
                except OSError:
                    pass  # the listing's own descriptor, closed by now
        for res, soft, hard in rlimits:
            if res == resource.RLIMIT_NPROC and os.geteuid() == 0:
                continue  # root ignores it; without a uid of its own the count would be the machine's
            if res == resource.RLIMIT_NPROC and limits.processes:
                continue  # the caller's uid counts all its processes: only "none at all" can be enforced
            try:
                resource.setrlimit(res, (0 if res == resource.RLIMIT_NPROC else soft,
                                         0 if res == resource.RLIMIT_NPROC else hard))
            except (ValueError, OSError):
                pass

    return setup


def run_weak(source: str, stdin: str, limits: local.SandboxLimits, audit: bool, channels: int,
             isolate: bool = False) -> local.RunOutcome:
    if isolate:  # as the caller's uid, without a PID namespace, the program could open the supervisor's
        # /proc/<pid>/fd and write the verdict itself: refuse rather than give a forgeable verdict
        return local.RunOutcome("error", None, "", "[gyre-sandbox] an isolated test needs kernel containment for a "
                                "sound verdict; this weak sandbox cannot run it", 0.0, channels=[b""] * channels)
    root = tempfile.mkdtemp(prefix="gyre-sbx-")
    pipes = [os.pipe() for _ in range(channels)]
    try:
        work = os.path.join(root, "work")
        os.mkdir(work, 0o700)
        solution = os.path.join(root, "solution.py")
        with open(solution, "w", encoding="utf-8") as f:
            f.write(source)
        stdin_path = os.path.join(root, "stdin")
        with open(stdin_path, "w+b") as stdin_file:
            stdin_file.write(stdin.encode("utf-8"))
            stdin_file.seek(0)
            argv = local._program_argv(local._boot_config(work, solution, stdin_path, limits, audit))
            start = time.monotonic()
            writers = [w for _, w in pipes]
            proc = subprocess.Popen(argv, stdin=stdin_file, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=work,
                                    env=local._env(work), start_new_session=True, close_fds=False,
                                    preexec_fn=_preexec(limits, writers))
        for w in writers:
            os.close(w)
        return _supervise(proc, pipes, limits, start)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _supervise(proc: subprocess.Popen, pipes: list, limits: local.SandboxLimits, start: float) -> local.RunOutcome:
    fds = {"stdout": proc.stdout.fileno(), "stderr": proc.stderr.fileno(),
           **{f"ch{i}": r for i, (r, _) in enumerate(pipes)}}
    streams = local._Streams(fds, limits.output_bytes, limits.channel_bytes)
    try:
        reason = local._watch(streams, proc.pid, start + limits.wall_s)
        seconds = time.monotonic() - start
        local._kill(proc.pid)
        local._drain(streams)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        record = {"status": status, "cpu_s": usage.ru_utime + usage.ru_stime, "uid": os.geteuid()}
        return local._outcome(record, reason, seconds, streams, len(pipes), limits, proc.pid)
    finally:
        streams.close(proc)
