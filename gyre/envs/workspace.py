"""An episode's sandboxed workspace: files its tools act on (Python programs, a shell) and its verifier
inspects afterwards.

The files live on the host in a private directory (mode 0700) that only gyre writes. Whatever the model
runs there runs in the code sandbox (``gyre.rewards.sandbox``: the kernel's containment, as for code
rewards): each command starts in a fresh sandbox holding a copy of the workspace's files in its work
directory, and when it ends the files it leaves there come back through a data channel and replace the
workspace's (folders come back only as the folders of its files: an empty one is not kept). The program
may forge what comes back, so it is checked before anything touches the host, at a cost bounded by the
budgets: a header line and one line per file (base64 of the path's bytes and of the data), counted before
it is parsed; relative paths inside the workspace only, each at most ``PATH_BYTES`` of UTF-8 and
``PATH_DEPTH`` names of at most ``PART_BYTES``; at most ``max_files`` files and folders together and
``disk_mb`` of data. The parent reads at most about 4/3 ``disk_mb`` + 1.4 KB per file of it, and at most
max(1 MiB, 16 x ``output_chars``) of the program's stdout and of its stderr (a program that writes more
is stopped). The new files are laid out in a fresh sibling directory whose entries then take the place of
the workspace's (the directory itself stays), so a program can change its own files, never a path outside
them, and a listing that cannot be kept (or a failure while writing it) leaves the workspace as it was,
said in the command's output. One command at a time: a lock holds each command, from the copy in to the
write-back, and every read and write of the files. ``memory_mb`` bounds each process of a command: a
shell command's processes (at most ``max_processes`` more) have that much each.

A verifier judges the workspace from outside the program's reach: it reads the files here, or runs tests
with ``score_program`` (the code reward's isolated runner: the program's process never holds the verdict).

Every workspace is removed when its episode ends (``remove``; ``AgentEnv`` calls it at the next reset and
at close), and created again from the task's files at each reset.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

PATH_BYTES = 1024
"""The longest path a workspace holds (UTF-8 bytes, relative to it)."""
PART_BYTES = 255
"""The longest name of a file or folder in it (UTF-8 bytes)."""
PATH_DEPTH = 32
"""The most names in a path (folders deep plus one): removing a tree holds a descriptor per level."""
_PATH_B64 = 4 * -(-PATH_BYTES // 3)
"""The longest path's base64."""
_NOT_A_LISTING = "what it sent back is not a listing of its files"
_LINE_BYTES = _PATH_B64 + 8
"""A listing line's most bytes besides 4/3 of its file's data: the path's base64, its data's base64
padding, a space and a newline."""

_PACK = '''
import atexit as _gyre_atexit


def _gyre_pack(top=__import__("os").getcwd()):  # the work directory, whatever the program's cwd is by now
    import base64, os
    lines, folders, left = [], set(), {budget}
    for root, dirs, names in os.walk(top):
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(root, name)
            if os.path.islink(full) or not os.path.isfile(full):
                continue
            raw = os.fsencode(os.path.relpath(full, top))
            with open(full, "rb") as f:
                data = f.read(left + 1)
            left -= len(data)
            parts = raw.split(b"/")
            folders.update(b"/".join(parts[:i]) for i in range(1, len(parts)))
            if left < 0 or len(lines) + 1 + len(folders) > {most} or len(raw) > {path_bytes} \
                    or len(parts) > {depth}:
                os.write(3, b"gyre-over\\n")
                return
            lines.append(base64.b64encode(raw) + b" " + base64.b64encode(data) + b"\\n")
    out = memoryview(b"gyre-files %d\\n" % len(lines) + b"".join(lines))
    while out:
        out = out[os.write(3, out):]


_gyre_atexit.register(_gyre_pack)
_gyre_path = _gyre_data = None
for _gyre_path, _gyre_data in {files!r}.items():
    import base64 as _gyre_b64, os as _gyre_os
    _gyre_dir = _gyre_os.path.dirname(_gyre_path)
    if _gyre_dir:
        _gyre_os.makedirs(_gyre_dir, exist_ok=True)
    with open(_gyre_path, "wb") as _gyre_f:
        _gyre_f.write(_gyre_b64.b64decode(_gyre_data))
del _gyre_atexit, _gyre_path, _gyre_data
__import__("sys").path.insert(0, __import__("os").getcwd())  # the workspace's modules import
exec(compile({code!r}, "main.py", "exec"), {{"__name__": "__main__", "__builtins__": __builtins__}})
'''


SHELL_PROGRAMS = ("sh", "ls", "cat", "head", "tail", "wc", "grep", "sed", "sort", "uniq", "cut", "tr", "mkdir",
                  "rm", "cp", "mv", "touch", "find", "diff", "echo", "printf", "test", "true", "false")
"""What a workspace's shell may run (those this machine has), each with the libraries it loads, read-only."""


@functools.lru_cache(maxsize=1)
def shell_programs() -> dict[str, str]:
    """Name -> path of the ``SHELL_PROGRAMS`` this machine has."""
    found = {name: shutil.which(name, path="/usr/bin:/bin") for name in SHELL_PROGRAMS}
    return {name: path for name, path in found.items() if path}


class WorkspaceError(ValueError):
    """A file or command the workspace refuses (a path outside it, a budget spent)."""


@dataclass(frozen=True)
class CommandResult:
    status: str
    """The sandbox's verdict: ok, error, timeout, memory, killed, blocked; refused (budget spent); error also
    when its files could not be written back."""
    output: str
    """What it printed (stdout, then stderr's tail on a failure), cut to the workspace's output_chars."""


class Workspace:
    """``create`` one per episode; ``run_python`` for the model's programs; ``read``, ``files`` and
    ``score_program`` for the verifier; ``remove`` when the episode ends. Safe to share between threads:
    its commands run one at a time."""

    def __init__(self, path: Path, disk_mb: int = 64, max_files: int = 2000, cpu_s: float = 10.0,
                 wall_s: float = 20.0, memory_mb: int = 512, max_commands: int = 64, output_chars: int = 8000,
                 max_processes: int = 16):
        self.path = path
        self.max_processes = max_processes
        self.disk_bytes, self.max_files = disk_mb << 20, max_files
        self.cpu_s, self.wall_s, self.memory_mb = cpu_s, wall_s, memory_mb
        self.max_commands, self.output_chars = max_commands, output_chars
        self.commands = 0
        self._lock = threading.RLock()

    @classmethod
    def create(cls, files: dict[str, str] | None = None, **limits) -> Workspace:
        """A fresh private directory holding ``files`` ({relative path: text}); raises WorkspaceError for
        files it cannot hold."""
        workspace = cls(Path(tempfile.mkdtemp(prefix="gyre-workspace-")), **limits)
        os.chmod(workspace.path, 0o700)
        try:
            workspace._replace({p: _encoded(p, str(t)) for p, t in (files or {}).items()})
        except BaseException:
            workspace.remove()
            raise
        return workspace

    @property
    def listing_bytes(self) -> int:
        """The most bytes of a command's listing of its files read back."""
        return 4 * self.disk_bytes // 3 + self.max_files * _LINE_BYTES + 4096

    # ---- what a verifier (or the agent's own code) reads and writes --------------------------------
    def files(self) -> list[str]:
        """The workspace's files, relative paths, sorted (links are not followed; there are none)."""
        with self._lock:
            if not self.path.is_dir():
                return []
            out, todo = [], [""]
            while todo:  # no recursion: a workspace may be PATH_BYTES / 2 folders deep
                folder = todo.pop()
                with os.scandir(self.path / folder) as entries:
                    for entry in entries:
                        rel = f"{folder}/{entry.name}" if folder else entry.name
                        if entry.is_dir(follow_symlinks=False):
                            todo.append(rel)
                        elif entry.is_file(follow_symlinks=False):
                            out.append(rel)
            return sorted(out)

    def read(self, path: str, most: int = 1 << 20) -> str:
        """A file's text (at most ``most`` bytes); '' when it does not exist."""
        with self._lock:
            target = self.path / _checked(path)
            if not target.is_file() or target.is_symlink():
                return ""
            with os.fdopen(os.open(target, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
                return f.read(most).decode("utf-8", "replace")

    def write(self, path: str, text: str) -> None:
        with self._lock:
            files = self._snapshot()
            files[str(_checked(path))] = _encoded(path, text)
            self._replace(files)

    def score_program(self, path: str, tests: dict | list, **options):
        """The code reward's verdict (``gyre.rewards.code.code_reward``: every test in a sandbox of its own,
        assert tests isolated from the program's process) on the program in ``path``: a RewardResult."""
        from gyre.rewards.code import score_code

        return score_code(self.read(path, most=self.disk_bytes), json.dumps(tests), **options)

    # ---- what the model runs --------------------------------------------------------------------------
    def run_python(self, code: str, stdin: str = "", shell: tuple[str, ...] = ()) -> CommandResult:
        """``code`` as ``main.py`` in a sandbox holding the workspace's files; the files it leaves become the
        workspace's. Refused once ``max_commands`` have run. ``shell``: programs it may run (``run_shell``).
        Never raises for what the program does or sends back (``SandboxUnavailable`` when no sandbox runs)."""
        from gyre.rewards.sandbox import run_python

        try:
            stdin.encode()
        except UnicodeEncodeError:
            return CommandResult("refused", "its stdin is not valid Unicode text (a lone surrogate)")
        with self._lock:
            if self.commands >= self.max_commands:
                return CommandResult("refused", f"the workspace's {self.max_commands} commands are used up")
            self.commands += 1
            packed = {p: base64.b64encode(d).decode() for p, d in self._snapshot().items()}
            program = _PACK.format(budget=self.disk_bytes, most=self.max_files, path_bytes=PATH_BYTES,
                                   depth=PATH_DEPTH, files=packed, code=code)
            outcome = run_python(program, stdin, self._limits(shell), channels=1, audit_hook=not shell)
            status, lost = self._write_back(outcome.channels[0] if outcome.channels else b"", outcome.status)
        text = outcome.stdout
        if outcome.status != "ok":
            tail = outcome.stderr.strip().splitlines()[-3:]
            text += "\n" + "\n".join(tail) + f"\n[{outcome.status}]"
        if lost:  # said, so the model (and whoever reads the transcript) knows its changes are gone
            text += f"\n[workspace] its files were not kept: {lost}"
        return CommandResult(status, text[-self.output_chars:] if len(text) > self.output_chars else text)

    def run_shell(self, command: str) -> CommandResult:
        """``command`` run by ``sh -c`` in a sandbox holding the workspace's files, with the programs of
        ``SHELL_PROGRAMS`` that this machine has (read-only) and nothing else of the host; the files it leaves
        become the workspace's. The kernel's containment holds it (the Python layer, which refuses process
        creation, is left out: a shell starts processes), within ``max_processes``."""
        programs = shell_programs()
        if "sh" not in programs:
            return CommandResult("refused", "no POSIX shell (sh) on this machine: use run_python")
        script = (f"import subprocess, sys\nsys.stdout.flush()\n"
                  f"sys.exit(subprocess.run([{programs['sh']!r}, '-c', {command!r}], env={{'PATH': "
                  f"{':'.join(sorted({os.path.dirname(p) for p in programs.values()}))!r}, 'HOME': '/work', "
                  f"'TMPDIR': '/work', 'LC_ALL': 'C.UTF-8'}}).returncode)")
        return self.run_python(script, shell=tuple(programs.values()))

    def remove(self) -> None:
        with self._lock:
            shutil.rmtree(self.path, ignore_errors=True)

    # ---- internals --------------------------------------------------------------------------------------
    def _limits(self, shell: tuple[str, ...]):
        from gyre.rewards.sandbox import SandboxLimits

        mb = max(1, self.disk_bytes >> 20)
        return SandboxLimits(cpu_s=self.cpu_s, wall_s=self.wall_s, memory_mb=self.memory_mb, disk_mb=2 * mb + 1,
                             file_size_mb=mb, files=self.max_files + 64,
                             output_bytes=max(1 << 20, 16 * self.output_chars), channel_bytes=self.listing_bytes,
                             processes=self.max_processes if shell else 0, allow_read=shell)

    def _write_back(self, raw: bytes, status: str) -> tuple[str, str | None]:
        """Make what a command sent back the workspace's files: (the command's status, None), or with why
        they were not kept (the workspace is then as it was); "error" when the host failed to write them."""
        try:
            files = self._unpack(raw)
        except WorkspaceError as exc:
            return status, str(exc)
        try:
            self._replace(files)
        except (OSError, ValueError, RecursionError) as exc:
            return "error", f"they could not be written here ({type(exc).__name__}: {str(exc)[:200]})"
        return status, None

    def _snapshot(self) -> dict[str, bytes]:
        out = {}
        for rel in self.files():
            with os.fdopen(os.open(self.path / rel, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
                out[rel] = f.read()
        return out

    def _unpack(self, raw: bytes) -> dict[str, bytes]:
        """The files a program sent back (the prelude's listing), checked at a cost bounded by the budgets:
        its size, then its lines counted, before any is parsed. Raises WorkspaceError saying why they
        cannot be kept."""
        if not raw:
            raise WorkspaceError("the program ended before they were collected")
        over = (f"more than {self.max_files} files and folders or {self.disk_bytes >> 20} MB, or a path longer "
                f"than {PATH_BYTES} bytes or {PATH_DEPTH} names")
        if len(raw) > self.listing_bytes:
            raise WorkspaceError(over)
        lines = raw.split(b"\n", self.max_files + 2)
        head, _, count = lines[0].partition(b" ")
        if head == b"gyre-over":
            raise WorkspaceError(over)
        if head != b"gyre-files" or not (count.isdigit() and len(count) < 10) or int(count) > self.max_files \
                or len(lines) != int(count) + 2 or lines[-1]:
            raise WorkspaceError(_NOT_A_LISTING)
        files, total = {}, 0
        for i in range(1, len(lines) - 1):
            fields, lines[i] = lines[i].split(b" ", 2), b""  # each line let go once read: memory ~ its data
            if len(fields) != 2 or len(fields[0]) > _PATH_B64:
                raise WorkspaceError(_NOT_A_LISTING)
            try:
                path = str(_checked(_b64(fields[0]).decode("utf-8")))
            except UnicodeDecodeError:
                raise WorkspaceError("a path that is not UTF-8") from None
            data = _b64(fields[1])
            total += len(data)
            if total > self.disk_bytes:
                raise WorkspaceError(over)
            if path in files:
                raise WorkspaceError(f"path {path[:80]!r} twice")
            files[path] = data
        _folders(files, self.max_files)
        return files

    def _replace(self, files: dict[str, bytes]) -> None:
        """Make the directory hold exactly ``files`` (paths checked here): laid out in a fresh sibling
        directory whose entries then take the place of its own, so folders left empty go and a failure leaves
        it as it was."""
        with self._lock:
            checked = {str(_checked(p)): d for p, d in files.items()}
            size = sum(map(len, checked.values()))
            if size > self.disk_bytes:
                raise WorkspaceError(f"{len(checked)} files of {size} bytes: the workspace holds at most "
                                     f"{self.disk_bytes} bytes")
            folders = _folders(checked, self.max_files)
            fresh = Path(tempfile.mkdtemp(dir=self.path.parent, prefix=self.path.name + "."))
            try:
                os.chmod(fresh, 0o700)
                for folder in folders:  # sorted: a folder before what it holds
                    os.mkdir(fresh / folder, 0o700)
                for rel, data in checked.items():
                    fd = os.open(fresh / rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                    with os.fdopen(fd, "wb") as f:
                        f.write(data)
                self._swap(fresh)
            except BaseException:
                shutil.rmtree(fresh, ignore_errors=True)
                raise

    def _swap(self, fresh: Path) -> None:
        """``fresh``'s entries take the place of the workspace's, one rename each, and the old ones are
        removed; the directory itself stays (a command agent working in it still is). A failed rename puts
        back what moved."""
        old = Path(tempfile.mkdtemp(dir=self.path.parent, prefix=self.path.name + "."))
        out, into = [], []
        try:
            for name in os.listdir(self.path):
                os.rename(self.path / name, old / name)
                out.append(name)
            for name in os.listdir(fresh):
                os.rename(fresh / name, self.path / name)
                into.append(name)
        except BaseException:
            for name in into:
                os.rename(self.path / name, fresh / name)
            for name in out:
                os.rename(old / name, self.path / name)
            raise
        finally:
            shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(fresh, ignore_errors=True)


def _encoded(path: str, text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate
        raise WorkspaceError(f"file {str(path)[:80]!r}: its text is not valid Unicode") from None


def _b64(field: bytes) -> bytes:
    try:
        return base64.b64decode(field, validate=True)
    except ValueError:
        raise WorkspaceError(_NOT_A_LISTING) from None


def _folders(files: dict[str, bytes], most: int) -> list[str]:
    """The folders that hold ``files`` (checked paths), sorted; raises WorkspaceError when they and the files
    together are more than ``most``, or a path is both a file and a folder. Bounded: it stops at ``most``."""
    folders: set[str] = set()
    for name in files:
        end = name.rfind("/")
        while end > 0 and name[:end] not in folders:  # a folder seen: so are those above it
            folders.add(name[:end])
            if len(folders) + len(files) > most:
                raise WorkspaceError(f"more than {most} files and folders")
            end = name.rfind("/", 0, end)
    if len(files) > most:
        raise WorkspaceError(f"more than {most} files and folders")
    clash = next((f for f in folders if f in files), None)
    if clash is not None:  # a name that is both a file and a folder cannot be laid out
        raise WorkspaceError(f"path {clash[:80]!r} both a file and a folder")
    return sorted(folders)


def _checked(path: str) -> PurePosixPath:
    """A relative path inside the workspace: no .., no absolute path, no empty or odd parts, valid UTF-8 of
    at most PATH_BYTES bytes with parts of at most PART_BYTES."""
    text = str(path)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate: no file name holds it
        size = -1
    p = PurePosixPath(text)
    if not 0 < size <= PATH_BYTES or "\x00" in text or p.is_absolute() or not 0 < len(p.parts) <= PATH_DEPTH \
            or any(part in ("..", ".", "") or len(part.encode()) > PART_BYTES for part in p.parts):
        raise WorkspaceError(f"path {text[:80]!r}: a relative path inside the workspace, valid UTF-8 of at most "
                             f"{PATH_BYTES} bytes and {PATH_DEPTH} names of at most {PART_BYTES} bytes each")
    return p
