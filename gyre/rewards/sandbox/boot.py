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


def lock_down(cfg):
    """The Python layer: refuse the one silent way to start a process, then install the audit hook."""
    import posix

    if not cfg["audit"]:
        return
    import _posixsubprocess

    exit_, write = posix._exit, posix.write
    blocked = BLOCKED_MARKER.encode() + b" _posixsubprocess.fork_exec\n"

    def refuse(*args, **kwargs):
        write(2, blocked)
        exit_(EXIT_BLOCKED)

    _posixsubprocess.fork_exec = refuse  # the one way to start a process that raises no audit event
    install_hook(cfg)


def fresh_module(filename):
    import sys

    module = type(sys)("__main__")
    module.__file__ = filename
    module.__builtins__ = __builtins__
    sys.modules["__main__"] = module
    sys.argv = [filename]
    return module


def run_code(source, filename, module, exits=None):
    """Run ``source`` in ``module``; its exit status (0, or what it passed to ``sys.exit``; 1 for an
    uncaught exception, reported like the interpreter would). A MemoryError ends the process. A
    ``sys.exit`` is also noted in ``exits`` (a list), when given."""
    import posix
    import sys

    try:
        exec(compile(source, filename, "exec"), module.__dict__)
    except MemoryError:
        posix.write(2, MEMORY_MARKER.encode() + b"\n")
        posix._exit(EXIT_MEMORY)
    except SystemExit as exc:
        if exits is not None:
            exits.append(exc.code)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
            return 1
        return exc.code or 0
    except BaseException:  # noqa: BLE001 - the program's own error: report it like the interpreter would
        kind, exc, tb = sys.exc_info()
        exc.__traceback__ = tb.tb_next  # the traceback starts at the program, not at this bootstrap
        sys.excepthook(kind, exc, tb.tb_next)
        return 1
    return 0


def finish(status):
    """Leave with ``os._exit`` (so no finaliser runs after the interpreter drops its audit hooks)."""
    import atexit
    import posix
    import sys

    try:
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 - the program's atexit code must not stop the exit
        pass
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a full or closed stream; what was written is kept
            pass
    posix._exit((status or 0) & 0xFF)


def main(cfg):
    """Read the program, lock the interpreter down, run the program in a fresh ``__main__`` and leave.
    An isolated test (``cfg["isolate"]``) runs in two processes instead, see ``isolated``."""
    with open(cfg["solution"], "rb") as f:
        source = f.read()
    if cfg.get("isolate"):
        isolated(cfg, source)
    lock_down(cfg)
    finish(run_code(source, cfg["filename"], fresh_module(cfg["filename"])))


# --- isolated tests ------------------------------------------------------------------------------------
# A test the parent cannot split runs in a process the program's code never runs in. Before anything
# untrusted runs, this process makes itself non-dumpable (the program's process, same uid, can then
# neither open its /proc/<pid>/fd or mem; ptrace and process_vm_* are refused by seccomp) and forks:
# the child closes the verdict channel (fd 3), runs the setup and the program, then answers calls of
# its functions with plain data; this process runs the setup and the test with the program's names
# bound to proxies of those calls, and writes the verdict on fd 3, which only it holds. The program
# can answer anything, but only data: whatever it does, a pass is the test completing here.

def isolated(cfg, payload):
    """``payload``: the run's JSON (codec, program, names). The test's text is on stdin, which the program's
    process closes unread: it never holds the test's expected values."""
    import json
    import posix

    data = json.loads(payload)
    why = harden()
    if why:
        posix.write(2, f"[gyre-sandbox] isolated test refused: {why}\n".encode())
        posix._exit(1)
    requests, replies = posix.pipe(), posix.pipe()
    if posix.fork() == 0:  # the test's text (stdin) is read only after this, by the test's process
        for fd in (0, 3, requests[1], replies[0]):
            posix.close(fd)
        serve(cfg, data, requests[0], replies[1])
    for fd in (requests[0], replies[1]):
        posix.close(fd)
    judge(cfg, data, requests[1], replies[0])


def harden():
    """Make this process non-dumpable; why the verdict would not be sound here, or ''."""
    import ctypes
    import sys

    failed = ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0  # PR_SET_DUMPABLE
    for name in [m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))]:
        del sys.modules[name]  # the program finds no raw memory access ready-made
    if failed:
        return "prctl(PR_SET_DUMPABLE) failed"
    with open("/proc/self/status") as f:
        caps = [line.split()[1] for line in f if line.startswith("CapEff:")]
    if not caps or int(caps[0], 16):  # e.g. a weak sandbox as root: ptrace would reach this process
        return "the sandboxed process holds capabilities, so the program could reach the test's process"
    return ""


def send(fd, message):
    import json
    import posix

    data = json.dumps(message).encode()
    data = len(data).to_bytes(8, "little") + data
    while data:
        data = data[posix.write(fd, data):]


def receive(fd, most=1 << 26):
    """One message, or None at end of file (the other process ended)."""
    import json
    import posix

    def exactly(n):
        out = b""
        while len(out) < n:
            chunk = posix.read(fd, min(n - len(out), 1 << 20))
            if not chunk:
                return None
            out += chunk
        return out

    head = exactly(8)
    size = int.from_bytes(head, "little") if head else None
    if size is None or size > most:
        return None
    body = exactly(size)
    return None if body is None else json.loads(body)


def read_all(fd):
    import posix

    chunks = []
    while True:
        chunk = posix.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def serve(cfg, data, requests, replies):
    """The program's process: setup and program, then each request ``[op, name, args, kwargs]``."""
    import itertools

    codec = {}
    exec(data["codec"], codec)
    encode, decode = codec["__gyre_encode"], codec["__gyre_decode"]
    lock_down(cfg)
    module = fresh_module(cfg["filename"])
    exits = []
    status = run_code(data["program"], cfg["filename"], module, exits)
    status = 1 if exits and not status else status  # exiting before the test runs fails it, as a split test
    send(replies, ["ready"] if status == 0 else ["ended", f"the program ended with status {status}"])
    while status == 0:
        request = receive(requests)
        if request is None:
            break
        try:
            if request[1] not in module.__dict__:
                raise NameError(f"name {request[1]!r} is not defined")
            value = module.__dict__[request[1]]
            if request[0] == "call":
                value = value(*[decode(a) for a in request[2]], **{k: decode(v) for k, v in request[3].items()})
                iterator = hasattr(type(value), "__next__")  # a generator: its items, read as the test would
                reply = ["iter" if iterator else "value", encode(list(itertools.islice(value, 100_000))
                                                                  if iterator else value)]
            elif callable(value):
                reply = ["callable"]
            elif type(value).__name__ == "module":
                reply = ["module", value.__name__]
            else:
                reply = ["value", encode(value)]
        except BaseException as exc:  # noqa: BLE001 - the program's error is the test's to see
            reply = ["raise", type(exc).__name__, str(exc)[:300]]
        send(replies, reply)
    finish(status)


def judge(cfg, data, requests, replies):
    """The test's process: setup and test over proxies; the verdict on fd 3."""
    import builtins
    import posix
    import sys

    codec = {}
    exec(data["codec"], codec)
    encode, decode = codec["__gyre_encode"], codec["__gyre_decode"]
    lock_down(cfg)

    def answer(request):
        send(requests, request)
        reply = receive(replies)
        if reply is None:
            raise RuntimeError("the program's process ended")
        if reply[0] == "raise":  # the program's exception, as a builtin type where it names one
            kind = getattr(builtins, str(reply[1]), None)
            # StopIteration would end the test's own map() or generator early, passing all(...): a call
            # that raises it raises RuntimeError here, as PEP 479 does for generators.
            if kind in (StopIteration, StopAsyncIteration):
                kind = RuntimeError
            elif not (isinstance(kind, type) and issubclass(kind, Exception)):
                kind = type(str(reply[1]), (Exception,), {})
            raise kind(str(reply[2]))
        value = decode(reply[1]) if reply[0] in ("value", "iter") else reply[1:]
        return reply[0], iter(value) if reply[0] == "iter" else value

    def proxy(name):
        def call(*args, **kwargs):
            return answer(["call", name, [encode(a) for a in args], {k: encode(v) for k, v in kwargs.items()}])[1]
        call.__name__ = call.__qualname__ = name
        return call

    module = fresh_module("test.py")
    verdict = {"passed": False}
    try:
        ready = receive(replies)
        if ready != ["ready"]:
            raise RuntimeError(ready[1] if ready else "the program's process ended before the test")
        for name in data["names"]:
            try:
                kind, got = answer(["get", name])
            except NameError:
                continue  # not the program's: the test fails with its own NameError if it uses it
            if kind == "callable":
                got = proxy(name)
            elif kind == "module":  # the same standard module, imported here
                got = __import__(got[0]) if got[0] in sys.stdlib_module_names else None
            module.__dict__[name] = got
        exec(compile(read_all(0).decode(), "test.py", "exec"), module.__dict__)
        verdict["passed"] = True
    except BaseException as exc:  # noqa: BLE001 - any way the test ends early fails it
        tb, line = exc.__traceback__, 0
        while tb is not None:  # the test's own innermost line (no source lookup: /work is the program's)
            line = tb.tb_lineno if tb.tb_frame.f_code.co_filename == "test.py" else line
            tb = tb.tb_next
        verdict["why"] = f"{type(exc).__name__}: {str(exc)[:200]} (test line {line})"
    send(3, verdict)
    posix.close(3)
    finish(0)
