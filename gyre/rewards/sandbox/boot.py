"""The code that runs inside the sandbox, before the program: the Python layer of ``sandbox.py``.

This module is not imported there: its source text is handed to the sandboxed interpreter (``python -c``,
which cannot import gyre), followed by a call ``main(config)``. So it must stay self-contained: no
module-level imports, functions that import what they need, and constants that are immutable or copied
before the program runs (the program can reach this module's globals through its frames; it cannot
reach what the audit hook captured in its closures).

Parent side, ``sandbox.py`` imports the constants below to classify outcomes.
"""

EXIT_BLOCKED = 113
EXIT_MEMORY = 114
BLOCKED_MARKER = "[gyre-sandbox] blocked:"
MEMORY_MARKER = "[gyre-sandbox] MemoryError"

# Audit events that end the program outright (exact names, then prefixes), and modules it may not import:
# _posixsubprocess.fork_exec starts processes without raising any audit event, _ctypes is raw memory
# access, sub-interpreters start without this interpreter's hooks, _test* expose C internals.
DENIED_EVENTS = frozenset({
    "os.system", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.kill", "os.killpg",
    "subprocess.Popen", "signal.pthread_kill", "pdb.Pdb", "webbrowser.open", "fcntl.ioctl",
    "code.__new__", "function.__new__", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
    "sys.settrace", "sys.setprofile", "sys._current_frames", "sys._current_exceptions",
    "resource.setrlimit", "resource.prlimit", "cpython.PyInterpreterState_New",
})
DENIED_PREFIXES = ("socket.", "ctypes.", "syslog.")
DENIED_IMPORTS = frozenset({
    "_posixsubprocess", "_ctypes", "_xxsubinterpreters", "_xxinterpchannels", "_testcapi",
    "_testinternalcapi", "_testmultiphase", "_testsinglephase", "_testbuffer", "_testimportmultiple",
})
# Path-taking audit events: (argument index, True for write access).
PATH_EVENTS = {
    "os.listdir": ((0, False),), "os.scandir": ((0, False),), "os.chdir": ((0, False),),
    "os.getxattr": ((0, False),), "os.listxattr": ((0, False),),
    "os.mkdir": ((0, True),), "os.rmdir": ((0, True),), "os.remove": ((0, True),),
    "os.chmod": ((0, True),), "os.chown": ((0, True),), "os.utime": ((0, True),),
    "os.truncate": ((0, True),), "os.setxattr": ((0, True),), "os.removexattr": ((0, True),),
    "os.rename": ((0, True), (1, True)), "os.link": ((0, True), (1, True)), "os.symlink": ((1, True),),
}


def resolve(path, cwd, lstat, readlink):
    """Absolute, symlink-free form of ``path`` (a realpath built only from functions captured before the
    program ran). Missing components are kept lexically, as the kernel would fail on them anyway."""
    todo = (path if path.startswith("/") else cwd + "/" + path).split("/")[::-1]
    out = []
    hops = 0
    while todo:
        name = todo.pop()
        if name == "" or name == ".":
            continue
        if name == "..":
            if out:
                out.pop()
            continue
        here = "/" + "/".join(out) + "/" + name if out else "/" + name
        try:
            mode = lstat(here).st_mode
        except OSError:
            out.append(name)
            continue
        if mode & 0o170000 != 0o120000:
            out.append(name)
            continue
        hops += 1
        if hops > 40:
            raise ValueError("too many levels of symbolic links")
        target = readlink(here)
        if target.startswith("/"):
            out = []
        todo.extend(target.split("/")[::-1])
    return "/" + "/".join(out)


def path_check(cfg, block):
    """The file-access policy: ``check(event, path, write_access)`` resolves ``path`` and ends the program
    unless it lies under an allowed root. Everything it uses is captured here, before the program runs:
    rebinding ``os.lstat`` or ``builtins.type`` afterwards changes nothing it sees."""
    import posix
    import sys

    lstat, readlink, getcwd, fspath = posix.lstat, posix.readlink, posix.getcwd, posix.fspath
    real, type_, str_, bytes_, int_, isinstance_ = resolve, type, str, bytes, int, isinstance
    writable = (cfg["work"],)
    readable = [cfg["work"], *cfg["readable"], real("/proc/self", "/", lstat, readlink)]
    readable += [real(p, getcwd(), lstat, readlink) for p in sys.path if p]
    readable = tuple(readable)

    def within(path, roots):
        for root in roots:
            if path == root or path.startswith(root + "/"):
                return True
        return False

    def check(event, value, write_access):
        if type_(value) is int_:
            return None  # an already open descriptor: it was checked when it was opened
        if value is None:
            value = "."
        if type_(value) is not str_ and type_(value) is not bytes_:
            value = fspath(value)  # a PathLike (program code may run here; frame access is refused)
        value = "".join([value]) if isinstance_(value, str_) else b"".join([value]).decode("utf-8", "surrogateescape")
        full = real(value, getcwd(), lstat, readlink)
        if not within(full, writable if write_access else readable):
            block(event, full)
        return full

    return check


def install_hook(cfg):
    """Install the audit hook (see the module docstring for what it refuses). Like the path check, it
    captures everything it calls before the program runs."""
    import posix
    import sys
    import types

    stat, write, exit_, bool_, base_exc = posix.stat, posix.write, posix._exit, bool, BaseException
    denied, prefixes, denied_imports, code = DENIED_EVENTS, DENIED_PREFIXES, DENIED_IMPORTS, EXIT_BLOCKED
    path_events = dict(PATH_EVENTS)  # a private copy: the program could edit the module-level dict
    write_flags = posix.O_WRONLY | posix.O_RDWR | posix.O_CREAT | posix.O_TRUNC | posix.O_APPEND
    marker = BLOCKED_MARKER.encode()
    frame_events = frozenset({"sys._getframe", "object.__getattr__", "sys._current_frames"})
    getframe, coroutine_code = sys._getframe, types.coroutine.__code__
    depth, trusted = [0], [False]

    def block(event, detail):
        write(2, marker + b" " + event.encode() + b" " + detail.encode("utf-8", "replace") + b"\n")
        exit_(code)

    check = path_check(cfg, block)

    def from_types_coroutine():
        """Whether a code object is being built by ``types.coroutine`` (asyncio uses it at import), which
        only sets a flag on a compiled function's code; any other construction of code objects is refused."""
        trusted[0] = True  # the frame access below raises audit events of its own
        try:
            return getframe(2).f_code is coroutine_code  # 0: here, 1: the hook, 2: the caller of replace()
        finally:
            trusted[0] = False

    def dispatch(event, args):
        if event == "open":
            full = check(event, args[0], bool_(args[2] & write_flags))
            try:
                is_dir = full is not None and stat(full).st_mode & 0o170000 == 0o040000
            except OSError:
                is_dir = False
            if is_dir:  # a directory descriptor would let dir_fd= calls resolve paths never checked here
                block("open(directory)", full)
        elif event in path_events:
            for index, write_access in path_events[event]:
                check(event, args[index], write_access)
        elif event == "socket.__new__":
            if args[1] != 1:  # only AF_UNIX, for socket pairs (asyncio's self-pipe); connect/bind are refused
                block(event, "")
        elif event == "socket.sendmsg":
            if args[1] is not None:  # on a connected pair (no address) only
                block(event, "")
        elif event == "import":
            if args[0] in denied_imports:
                block(event, args[0])
        elif event in denied or event.startswith(prefixes):
            block(event, "")

    def hook(event, args):
        if trusted[0] or (event == "code.__new__" and from_types_coroutine()):
            return
        if depth[0] and event in frame_events:
            block(event, "(inside the sandbox's own path check)")
        depth[0] += 1
        try:
            dispatch(event, args)
        except base_exc:  # an odd argument must never become a way around the check
            block(event, "(unreadable arguments)")
        finally:
            depth[0] -= 1

    sys.addaudithook(hook)


def main(cfg):
    """Read and compile the program, lock the interpreter down, run the program in a fresh ``__main__``
    and leave with ``os._exit`` (so no finaliser runs after the interpreter drops its audit hooks)."""
    import atexit
    import posix
    import sys

    exit_, write = posix._exit, posix.write
    with open(cfg["solution"], "rb") as f:
        source = f.read()
    if cfg["audit"]:
        import _posixsubprocess

        blocked = BLOCKED_MARKER.encode() + b" _posixsubprocess.fork_exec\n"

        def refuse(*args, **kwargs):
            write(2, blocked)
            exit_(EXIT_BLOCKED)

        _posixsubprocess.fork_exec = refuse  # the one way to start a process that raises no audit event
        install_hook(cfg)
    module = type(sys)("__main__")
    module.__file__ = cfg["filename"]
    module.__builtins__ = __builtins__
    sys.modules["__main__"] = module
    sys.argv = [cfg["filename"]]
    status = 0
    try:
        exec(compile(source, cfg["filename"], "exec"), module.__dict__)
    except MemoryError:
        write(2, MEMORY_MARKER.encode() + b"\n")
        exit_(EXIT_MEMORY)
    except SystemExit as exc:
        status = exc.code
        if status is not None and not isinstance(status, int):
            print(status, file=sys.stderr)
            status = 1
    except BaseException:  # noqa: BLE001 - the program's own error: report it like the interpreter would
        kind, exc, tb = sys.exc_info()
        exc.__traceback__ = tb.tb_next  # the traceback starts at the program, not at this bootstrap
        sys.excepthook(kind, exc, tb.tb_next)
        status = 1
    try:
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 - the program's atexit code must not stop the exit
        pass
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a full or closed stream; what was written is kept
            pass
    exit_((status or 0) & 0xFF)
