"""One environment instance in a child process of its own, with a deadline on every call.

Environment code is untrusted in the sense that matters for a run: it may raise, hang, crash its
process or return junk. A Python call cannot be stopped from inside its own process, so each instance
lives in a spawned child (``EnvSlot``): a call past its deadline kills the child, a crash is seen as
the pipe closing, and either way the call returns an ``EnvFailure`` (one trajectory lost) and the next
call starts a fresh child. A raise or an invalid return leaves the child running (the next ``reset``
starts a new episode). A step on a child not reset since it started fails at once (``crashed``): the
episode's state died with the child before it (or with its environment worker, whose replacement hosts
fresh slots), and a fresh environment must not silently play on. Observations longer than
``max_observation_chars`` are cut (``info`` says so): a runaway environment must not flood the driver.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import tempfile
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection

from gyre.envs.protocol import (
    EnvError,
    EnvFailure,
    EnvReset,
    EnvStep,
    call,
    check_reset,
    check_step,
    cut_messages,
    make_env,
    observation_text,
)
from gyre.rewards.runner import die_with_parent

SCRATCH_PREFIX = "gyre-env-"
"""Environment processes' scratch directories: ``gyre-env-<pid of the host process>-*`` in the temp dir."""
START_S = 120.0
"""A child that has not built its environment by then is killed (its import hangs)."""


@dataclass(frozen=True)
class EnvSpec:
    """Which environment a slot hosts."""

    name: str
    """``gyre:<name>``, ``gem:<id>``, ``module:Class`` or ``file.py:Class`` (``gyre.envs.protocol``)."""
    kwargs: dict
    max_observation_chars: int = 20_000
    tools: tuple[str, ...] = ()
    """Tools the environment is given (``gyre.envs.tools.TOOLS``)."""
    tool_format: str = "tags"
    max_tool_calls: int = 4

    def build(self):
        """The environment, wrapped with its tools (in the process that will step it)."""
        env = make_env(self.name, self.kwargs)
        if not self.tools:
            return env
        from gyre.envs.tools import TOOLS, ToolEnv

        return ToolEnv(env, [TOOLS[name]() for name in self.tools], self.tool_format, self.max_tool_calls)


class EnvSlot:
    """One environment in a child process: ``reset`` / ``step`` with deadlines (see the module docstring)."""

    def __init__(self, spec: EnvSpec):
        self.spec = spec
        self._ctx = mp.get_context("spawn")  # never forked: the host is a multi-threaded Ray worker
        self._proc: mp.Process | None = None
        self._scratch: str | None = None
        """The child's temporary directory (``tempfile``'s in it), removed when the child ends."""
        self._conn: Connection | None = None
        self.restarts = 0
        """Children killed or found dead and started again."""
        self._reset_done = False
        """The running child has been reset: it holds an episode a step may act on."""

    def reset(self, seed: int | None, deadline_s: float) -> EnvReset | EnvFailure:
        return self._call("reset", seed, deadline_s)

    def step(self, action: str, deadline_s: float) -> EnvStep | EnvFailure:
        return self._call("step", action, deadline_s)

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.send(("close", None))
            except OSError:
                pass
        self._stop()

    def _call(self, op: str, arg, deadline_s: float):
        if op == "reset":
            self._reset_done = False
        failure = self._ensure()
        if failure is not None:
            return failure
        if op == "step" and not self._reset_done:
            return EnvFailure("crashed", "step() on an environment process that holds no episode: the one its "
                                         "reset() ran in was lost (or reset() was never called)")
        try:
            self._conn.send((op, arg))
        except OSError:
            return self._lost(f"its process was gone before {op}()")
        if not self._conn.poll(deadline_s):
            self._stop()
            self.restarts += 1
            what = f"reset(seed={arg!r})" if op == "reset" else "step()"
            return EnvFailure("timeout", f"env {self.spec.name!r}: {what} did not return within {deadline_s:g} s "
                                         f"(env.{op}_timeout_s; its process was killed)")
        try:
            kind, payload = self._conn.recv()
        except (EOFError, OSError):
            return self._lost(f"its process died during {op}() (exit code {self._exitcode()})")
        if kind != "ok":
            return EnvFailure(kind, payload)
        if op == "reset":
            self._reset_done = True
        return payload

    def _ensure(self) -> EnvFailure | None:
        """A running child that has built its environment (started now if there is none)."""
        if self._proc is not None and self._proc.is_alive():
            return None
        if self._proc is not None:
            self._stop()
            self.restarts += 1
        parent, child = self._ctx.Pipe()
        sweep_scratch()
        # the child's temporary files: removed with it (named by this process, for the sweep if it is killed)
        self._scratch = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")
        self._proc = self._ctx.Process(target=_serve, args=(child, self.spec, os.getpid(), self._scratch),
                                       daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        if not parent.poll(START_S):
            self._stop()
            return EnvFailure("timeout", f"the environment {self.spec.name!r} was not built within {START_S:g} s")
        try:
            kind, payload = parent.recv()
        except (EOFError, OSError):
            failure = EnvFailure("crashed", f"building {self.spec.name!r} killed its process (exit code "
                                            f"{self._exitcode()})")
            self._stop()
            return failure
        if kind != "ready":
            self._stop()
            raise EnvError(payload)  # a config error, the same for every slot: the run must say so
        return None

    def _lost(self, why: str) -> EnvFailure:
        self._stop()
        self.restarts += 1
        return EnvFailure("crashed", why)

    def _exitcode(self):
        if self._proc is None:
            return None
        self._proc.join(timeout=1)
        return self._proc.exitcode

    def _stop(self) -> None:
        self._reset_done = False
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=5)
        if self._conn is not None:
            self._conn.close()
        if self._scratch is not None:  # what the environment left (an agent's workspaces), even when killed
            shutil.rmtree(self._scratch, ignore_errors=True)
        self._proc, self._conn, self._scratch = None, None, None


def sweep_scratch() -> int:
    """Remove the scratch directories of host processes that are gone (an environment worker killed outright
    cannot remove its children's); returns how many. Only this user's, of processes no longer running."""
    removed = 0
    root = tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(root) if n.startswith(SCRATCH_PREFIX)]
    except OSError:
        return 0
    for name in names:
        pid, _, rest = name[len(SCRATCH_PREFIX):].partition("-")
        path = os.path.join(root, name)
        if not (pid.isdigit() and rest) or _running(int(pid)):
            continue
        try:
            if os.lstat(path).st_uid != os.geteuid() or os.path.islink(path):
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: running
        return True
    return True


def _serve(conn: Connection, spec: EnvSpec, parent: int, scratch: str | None = None) -> None:
    """Child loop: build the environment, then answer ("ok", record) or (failure kind, message) per call.
    ``scratch``: its temporary directory (and its children's), which the slot removes when it ends."""
    die_with_parent(parent)
    if scratch is not None:
        tempfile.tempdir = scratch
        os.environ["TMPDIR"] = scratch
    try:
        env = spec.build()
    except EnvError as exc:
        conn.send(("error", str(exc)))
        return
    except BaseException as exc:  # noqa: BLE001 - the user's constructor failed: say where
        conn.send(("error", f"building environment {spec.name!r} failed: {_describe(exc)}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            op, arg = conn.recv()
        except (EOFError, OSError):
            return
        if op == "close":
            close = getattr(env, "close", None)
            if callable(close):
                try:
                    close()
                except BaseException:  # noqa: BLE001 - closing is best effort
                    pass
            return
        conn.send(_answer(env, op, arg, spec.max_observation_chars))


def _answer(env, op: str, arg, max_chars: int) -> tuple[str, object]:
    start = time.perf_counter()
    try:
        raw = call(env.reset, arg) if op == "reset" else call(env.step, arg)
    except BaseException as exc:  # noqa: BLE001 - the trajectory fails, never the loop
        return "error", f"{op}() raised {_describe(exc)}"
    try:
        record = check_reset(raw) if op == "reset" else check_step(raw)
    except EnvError as exc:
        return "invalid", str(exc)
    if isinstance(record.observation, str) and len(record.observation) > max_chars:
        record.observation = record.observation[:max_chars]
        record.info["gyre_observation_cut"] = True
    elif isinstance(record.observation, dict) and len(observation_text(record.observation)) > max_chars:
        record.observation = cut_messages(record.observation, max_chars)
        record.info["gyre_observation_cut"] = True
    record.info["gyre_latency_s"] = time.perf_counter() - start
    return "ok", record


def _describe(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}, line {frames[-1].lineno}" if frames else ""
    text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    return f"{type(exc).__name__}{': ' + text if text else ''}{where}"
