"""The kernel layer of the sandbox: builds the namespaces and starts the program inside them.

Like ``boot.py`` this module is not imported where it runs: its source is executed by a fresh interpreter
(``python -I -S -B -c SOURCE``, which cannot import gyre), started by the supervisor in ``local.py``,
and followed by a call ``main(config_fd)``. It must stay self-contained: no module-level imports.

Three processes, none of which the program can touch:

- **stub** (host PID namespace, root or the user's uid): reads its configuration, dies with the
  supervisor (``PR_SET_PDEATHSIG``), unshares the mount, PID, network, IPC and UTS namespaces (and a
  user namespace when not root), forks the namespace's init, waits for it and exits.
- **init** (PID 1 of the new PID namespace, still privileged): dies with the stub (a second death
  signal), builds a new root file system on a size-limited tmpfs (the Python installation and the
  shared libraries it loads, bind-mounted read-only at their own paths, a few /dev nodes, /proc of the
  new PID namespace, a size- and inode-limited tmpfs at /work), ``pivot_root``s into it and detaches
  the host's, then forks the program and waits for it. When the program exits, init reports its wait
  status and CPU time on a pipe and exits: the kernel then kills every process left in the namespace
  (a daemon started with ``setsid`` included) and the tmpfs mounts vanish with the namespace, so
  nothing is left on the host whatever the program did and whoever's deadline fired.
- **program** (PID 2, a dedicated unprivileged uid): rlimits, ``PR_SET_NO_NEW_PRIVS``, a seccomp filter,
  then ``execve`` of the interpreter with the Python-layer bootstrap.

The program cannot signal init (the kernel drops signals to a namespace's init from inside it unless
init handles them, and they run as different uids), cannot ptrace it (a different uid, or no
capabilities in user-namespace mode, and ptrace is refused by seccomp), and cannot see the stub.
"""

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 32, 1024, 2048, 4096, 16384
MS_PRIVATE, MS_RELATIME = 1 << 18, 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 1, 4, 38, 22
SECCOMP_MODE_FILTER = 2
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
"""pivot_root has no libc wrapper: its syscall number per architecture (else chroot is the fallback)."""
SETUP_FAILED = 126


def libc():
    import ctypes

    lib = ctypes.CDLL(None, use_errno=True)
    lib.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    lib.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.unshare.argtypes = [ctypes.c_int]
    lib.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return lib


def check(rc, what):
    import ctypes
    import os

    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(lib, source, target, fstype, flags, data=None):
    enc = lambda s: s.encode() if s is not None else None
    check(lib.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def read_config(fd):
    import marshal  # built in: json would cost this process a few milliseconds of imports
    import os

    chunks = []
    while True:
        chunk = os.pread(fd, 1 << 20, sum(len(c) for c in chunks))
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return marshal.loads(b"".join(chunks))


def report(fd, record):
    """One record on the status pipe: a 4-byte length, then the marshalled dict (the supervisor reads
    them all after the stub exits)."""
    import marshal
    import os

    data = marshal.dumps(record)
    try:
        os.write(fd, len(data).to_bytes(4, "little") + data)
    except OSError:
        pass  # the supervisor is gone; nothing to tell


def die_with_parent(lib, alive_fd=None):
    """SIGKILL this process when its parent dies; then close the race with a parent already gone."""
    import os
    import select
    import signal

    check(lib.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
    if alive_fd is None:
        return
    poll = select.poll()  # the parent holds the write end: a hang-up means it has already died
    poll.register(alive_fd, select.POLLHUP)
    if poll.poll(0):
        os._exit(SETUP_FAILED)


def map_user(cfg):
    """User-namespace mode: map the caller's uid and gid to ``cfg['uid']`` inside (one id, no groups)."""
    for name, text in (("setgroups", "deny"), ("uid_map", f"{cfg['uid']} {cfg['outer_uid']} 1"),
                       ("gid_map", f"{cfg['uid']} {cfg['outer_gid']} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def keep_flags(path):
    """The per-mount flags a bind remount must repeat (a locked flag may not be cleared)."""
    import os

    st = os.statvfs(path).f_flag
    flags = st & (MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME)
    return flags | (MS_RELATIME if st & os.ST_RELATIME else 0)


def submounts(target):
    """Mount points strictly below ``target`` (a recursive bind brings them along)."""
    import re

    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    points = [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), p) for p in points]
    return [p for p in points if p.startswith(target.rstrip("/") + "/")]


def bind_readonly(lib, source, target, device=False):
    """A read-only bind mount, every mount below it read-only too; a device node keeps working (no
    nodev), yet cannot be replaced."""
    mount(lib, source, target, None, MS_BIND | MS_REC)
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | (0 if device else MS_NODEV)
    for point in [target, *submounts(target)]:
        mount(lib, None, point, None, flags | keep_flags(point))


def populate(lib, cfg, root):
    """The new root: the host paths of ``cfg['plan']`` recreated at their own paths (directories made,
    symbolic links copied, files and trees bind-mounted read-only), the program's files, /work."""
    import os

    for kind, path, *rest in cfg["plan"]:
        target = root + path
        if kind == "dir":
            os.makedirs(target, 0o755, exist_ok=True)
        elif kind == "link":
            if not os.path.lexists(target):
                os.symlink(rest[0], target)
        elif kind in ("file", "dev"):
            if not os.path.exists(target):
                os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o444))
            bind_readonly(lib, path, target, device=kind == "dev")
        elif kind == "tree":
            os.makedirs(target, 0o755, exist_ok=True)
            bind_readonly(lib, path, target)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        if os.path.isdir(root + "/dev") and not os.path.lexists(f"{root}/dev/{name}"):
            os.symlink(target, f"{root}/dev/{name}")
    os.makedirs(root + "/sandbox", 0o755, exist_ok=True)
    for name in ("solution.py", "stdin"):
        with open(f"{root}/sandbox/{name}", "w", encoding="utf-8", newline="") as f:
            f.write(cfg[name])
        os.chmod(f"{root}/sandbox/{name}", 0o444)
    os.mkdir(root + "/work", 0o700)
    uid = cfg["uid"]
    size = f"size={cfg['disk_kb']}k,nr_inodes={cfg['inodes']},mode=0700,uid={uid},gid={uid}"
    mount(lib, "tmpfs", root + "/work", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, size)
    if not os.path.lexists(root + "/tmp"):  # tempfile and habits that write to /tmp land in the quota
        os.symlink("work", root + "/tmp")
    if cfg["proc"]:
        os.mkdir(root + "/proc", 0o555)
        try:  # this PID namespace's processes only; no /proc/sys and friends
            mount(lib, "proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "subset=pid,hidepid=2")
        except OSError:
            pass  # e.g. a user namespace under a masked /proc: the program runs without /proc


def enter_root(lib, cfg):
    """Build the new root on a tmpfs at ``cfg['staging']`` and make it the root; the host's is detached."""
    import os
    import platform

    mount(lib, None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here propagates back to the host
    root = cfg["staging"]
    mount(lib, "tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['root_kb']}k,mode=0755")
    populate(lib, cfg, root)
    os.mkdir(root + "/.old")
    number = PIVOT_ROOT.get(platform.machine())
    if number is not None:
        check(lib.syscall(number, root.encode(), (root + "/.old").encode()), "pivot_root")
        os.chdir("/")
        check(lib.umount2(b"/.old", MNT_DETACH), "umount old root")
        os.rmdir("/.old")
    else:  # no pivot_root number known: move the new root over / (the program cannot chroot back out)
        os.rmdir(root + "/.old")
        os.chdir(root)
        mount(lib, root, "/", None, 8192)  # MS_MOVE
        os.chroot(".")
        os.chdir("/")
    mount(lib, None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def exec_program(lib, cfg, channels, keep):
    """In the program's process: descriptors, identity, limits, seccomp, then exec (never returns).
    ``keep`` (close-on-exec) stays open until the exec, to report a failure before it."""
    import ctypes
    import fcntl
    import os
    import resource

    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 256) for fd in channels]  # out of the way of 3, 4, ...
    for i, fd in enumerate(high):  # data channels become fds 3, 4, ... in channel order
        os.dup2(fd, 3 + i, inheritable=True)
    stdin = os.open("/sandbox/stdin", os.O_RDONLY)
    os.dup2(stdin, 0)
    os.closerange(3 + len(channels), keep)
    os.closerange(keep + 1, 1 << 16)
    os.chdir("/work")
    for res, soft, hard in cfg["rlimits"]:
        try:
            resource.setrlimit(res, (soft, hard))
        except (ValueError, OSError):
            if res != resource.RLIMIT_STACK:  # a stack hard limit below ours stays as it is
                raise
    if cfg["mode"] == "root":
        uid = cfg["uid"]
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    check(lib.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    if cfg["seccomp"]:
        import base64

        code = base64.b64decode(cfg["seccomp"])

        class Prog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

        prog = Prog(len(code) // 8, code)
        check(lib.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0), "seccomp")
    os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])


def run_init(lib, cfg, status_fd, channels, alive_fd):
    """PID 1: root file system, the program, its exit status; then exit, which ends the namespace."""
    import os
    import signal

    die_with_parent(lib, alive_fd)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    lib.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no ptrace, no /proc/1/mem, even for the same uid
    try:
        enter_root(lib, cfg)
    except OSError as exc:
        report(status_fd, {"setup_error": str(exc)})
        os._exit(SETUP_FAILED)
    failed_r, failed_w = os.pipe()  # close-on-exec: EOF once the program's exec succeeded
    pid = os.fork()
    if pid == 0:
        try:
            os.close(status_fd)
            os.close(failed_r)
            exec_program(lib, cfg, channels, failed_w)
        except BaseException as exc:  # noqa: BLE001 - anything before exec is a sandbox failure
            os.write(failed_w, f"could not start the program: {exc}".encode()[:2000])
        os._exit(SETUP_FAILED)
    os.close(failed_w)
    for fd in (*channels, 0, 1, 2):  # only the program holds its output and channels now
        os.close(fd)
    failure = os.read(failed_r, 4096)
    if failure:  # a sandbox failure, not the program's outcome
        report(status_fd, {"setup_error": failure.decode("utf-8", "replace")})
    while True:
        reaped, status, usage = os.wait4(-1, 0)  # orphans re-parented here are reaped too
        if reaped == pid:
            break
    report(status_fd, {"status": status, "cpu_s": usage.ru_utime + usage.ru_stime})
    os._exit(0)


def main(cfg_fd):
    """The stub: configuration, namespaces, the init process, its exit."""
    import os

    cfg = read_config(cfg_fd)
    lib = libc()
    status_fd, channels = cfg["status_fd"], cfg["channel_fds"]
    die_with_parent(lib)
    if os.getppid() != cfg["supervisor"]:
        os._exit(SETUP_FAILED)  # the supervisor died before the death signal was armed
    if cfg["mode"] == "root":
        cfg["uid"] = cfg["uid_base"] + os.getpid()  # unique while this stub lives
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    try:
        check(lib.unshare(flags | (CLONE_NEWUSER if cfg["mode"] == "userns" else 0)), "unshare")
        if cfg["mode"] == "userns":
            map_user(cfg)
    except OSError as exc:
        report(status_fd, {"setup_error": str(exc)})
        os._exit(SETUP_FAILED)
    alive_r, alive_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(alive_w)
        run_init(lib, cfg, status_fd, channels, alive_r)
    report(status_fd, {"init_pid": pid, "uid": cfg["uid"]})
    for fd in (*channels, status_fd, alive_r, 0, 1, 2):
        os.close(fd)
    os.waitpid(pid, 0)
    os._exit(0)
