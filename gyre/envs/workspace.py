"""An episode's sandboxed workspace: files its tools act on (Python programs, a shell) and its verifier
inspects afterwards.

The files live on the host in a private directory (mode 0700) that only gyre writes. Whatever the model
runs there runs in the code sandbox (``gyre.rewards.sandbox``: the kernel's containment, as for code
rewards): each command starts in a fresh sandbox holding a copy of the workspace's files in its work
directory, and when it ends the files it leaves there come back through a data channel and replace the
workspace's. What comes back is checked before anything touches the host (relative paths inside the
workspace only, within the disk and file budgets): a program can change its own files, never a path
outside them, and the parent reads at most ``disk_mb`` of it back. A verifier judges the workspace from
outside the program's reach: it reads the files here, or runs tests with ``score_program`` (the code
reward's isolated runner: the program's process never holds the verdict).

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
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

_PACK = '''
import atexit as _gyre_atexit


def _gyre_pack():
    import base64, json, os
    out, left = {{}}, {budget}
    for root, dirs, names in os.walk("."):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)[2:]
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                data = f.read(left + 1)
            left -= len(data)
            if left < 0 or len(out) >= {most}:
                os.write(3, json.dumps({{"over": True}}).encode())
                return
            out[path] = base64.b64encode(data).decode()
    os.write(3, json.dumps({{"files": out}}).encode())


_gyre_atexit.register(_gyre_pack)
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
    """The sandbox's verdict: ok, error, timeout, memory, killed, blocked; refused (budget spent)."""
    output: str
    """What it printed (stdout, then stderr's tail on a failure), cut to the workspace's output_chars."""


class Workspace:
    """``create`` one per episode; ``run_python`` for the model's programs; ``read``, ``files`` and
    ``score_program`` for the verifier; ``remove`` when the episode ends."""

    def __init__(self, path: Path, disk_mb: int = 64, max_files: int = 2000, cpu_s: float = 10.0,
                 wall_s: float = 20.0, memory_mb: int = 512, max_commands: int = 64, output_chars: int = 8000,
                 max_processes: int = 16):
        self.path = path
        self.max_processes = max_processes
        self.disk_bytes, self.max_files = disk_mb << 20, max_files
        self.cpu_s, self.wall_s, self.memory_mb = cpu_s, wall_s, memory_mb
        self.max_commands, self.output_chars = max_commands, output_chars
        self.commands = 0

    @classmethod
    def create(cls, files: dict[str, str] | None = None, **limits) -> Workspace:
        """A fresh private directory holding ``files`` ({relative path: text})."""
        workspace = cls(Path(tempfile.mkdtemp(prefix="gyre-workspace-")), **limits)
        os.chmod(workspace.path, 0o700)
        try:
            workspace._replace({p: str(t).encode() for p, t in (files or {}).items()})
        except BaseException:
            workspace.remove()
            raise
        return workspace

    # ---- what a verifier (or the agent's own code) reads and writes --------------------------------
    def files(self) -> list[str]:
        """The workspace's files, relative paths, sorted."""
        return sorted(str(p.relative_to(self.path)) for p in self.path.rglob("*") if p.is_file())

    def read(self, path: str, most: int = 1 << 20) -> str:
        """A file's text (at most ``most`` bytes); '' when it does not exist."""
        target = self.path / _checked(path)
        if not target.is_file() or target.is_symlink():
            return ""
        with open(target, "rb") as f:
            return f.read(most).decode("utf-8", "replace")

    def write(self, path: str, text: str) -> None:
        files = self._snapshot()
        files[str(_checked(path))] = text.encode()
        self._replace(files)

    def score_program(self, path: str, tests: dict | list, **options):
        """The code reward's verdict (``gyre.rewards.code.code_reward``: every test in a sandbox of its own,
        assert tests isolated from the program's process) on the program in ``path``: a RewardResult."""
        from gyre.rewards.code import code_reward

        return code_reward(f"```python\n{self.read(path)}\n```", json.dumps(tests), **options)

    # ---- what the model runs --------------------------------------------------------------------------
    def run_python(self, code: str, stdin: str = "", shell: tuple[str, ...] = ()) -> CommandResult:
        """``code`` as ``main.py`` in a sandbox holding the workspace's files; the files it leaves become the
        workspace's. Refused once ``max_commands`` have run. ``shell``: programs it may run (``run_shell``)."""
        from gyre.rewards.sandbox import SandboxLimits, run_python

        if self.commands >= self.max_commands:
            return CommandResult("refused", f"the workspace's {self.max_commands} commands are used up")
        self.commands += 1
        packed = {p: base64.b64encode(d).decode() for p, d in self._snapshot().items()}
        program = _PACK.format(budget=self.disk_bytes, most=self.max_files, files=packed, code=code)
        mb = max(1, self.disk_bytes >> 20)
        limits = SandboxLimits(cpu_s=self.cpu_s, wall_s=self.wall_s, memory_mb=self.memory_mb, disk_mb=2 * mb + 1,
                               file_size_mb=mb, files=self.max_files + 64,
                               output_bytes=max(1_000_000, 2 * self.disk_bytes),
                               processes=self.max_processes if shell else 0, allow_read=shell)
        outcome = run_python(program, stdin, limits, channels=1, audit_hook=not shell)
        back = self._unpack(outcome.channels[0] if outcome.channels else b"")
        if back is not None:
            self._replace(back)
        text = outcome.stdout
        if outcome.status != "ok":
            tail = outcome.stderr.strip().splitlines()[-3:]
            text += "\n" + "\n".join(tail) + f"\n[{outcome.status}]"
        if back is None:  # said, so the model (and whoever reads the transcript) knows its changes are gone
            text += (f"\n[workspace] its files were not kept: more than {self.max_files} files or "
                     f"{self.disk_bytes >> 20} MB, or the program ended before they were collected")
        return CommandResult(outcome.status, text[-self.output_chars:] if len(text) > self.output_chars else text)

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
        shutil.rmtree(self.path, ignore_errors=True)

    # ---- internals --------------------------------------------------------------------------------------
    def _snapshot(self) -> dict[str, bytes]:
        return {p: (self.path / p).read_bytes() for p in self.files()}

    def _unpack(self, raw: bytes) -> dict[str, bytes] | None:
        """The files a program sent back, checked; None when what came back is not a valid listing (the
        workspace is then left as it was)."""
        if not raw or len(raw) > 2 * self.disk_bytes + 4096:
            return None
        try:
            listing = json.loads(raw)["files"]
            files = {str(_checked(p)): base64.b64decode(d, validate=True) for p, d in listing.items()}
        except (ValueError, TypeError, AttributeError, KeyError, WorkspaceError):
            return None
        if len(files) > self.max_files or sum(map(len, files.values())) > self.disk_bytes:
            return None
        folders = {str(p) for name in files for p in PurePosixPath(name).parents}
        if folders & set(files):  # a name that is both a file and a folder cannot be laid out
            return None
        return files

    def _replace(self, files: dict[str, bytes]) -> None:
        """Make the directory hold exactly ``files`` (paths checked by the caller or here)."""
        if len(files) > self.max_files or sum(map(len, files.values())) > self.disk_bytes:
            raise WorkspaceError(f"{len(files)} files of {sum(map(len, files.values()))} bytes: the workspace holds "
                                 f"at most {self.max_files} files of {self.disk_bytes} bytes")
        checked = {str(_checked(p)): d for p, d in files.items()}
        for old in self.files():
            if old not in checked:
                (self.path / old).unlink()
        for rel, data in checked.items():
            target = self.path / rel
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)


def _checked(path: str) -> PurePosixPath:
    """A relative path inside the workspace (no .., no absolute path, no empty or odd parts)."""
    p = PurePosixPath(str(path))
    if not str(path) or "\x00" in str(path) or p.is_absolute() or any(part in ("..", "") for part in p.parts) \
            or p.parts[:1] == (".",) and len(p.parts) == 1:
        raise WorkspaceError(f"path {str(path)[:80]!r}: a relative path inside the workspace")
    return p
