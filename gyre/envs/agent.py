"""An agent program as an environment: it talks to the policy through an OpenAI-compatible endpoint.

Configured by ``env.agent`` (``gyre.config.agent_schema``). Each episode (``reset(seed)``) takes a task
(``tasks``: a JSONL file's line ``seed mod n``, or a ``module:function`` of the seed), opens a session on
the environment's own endpoint (``gyre.envs.endpoint``: a base URL and a fresh API key) and starts the
agent on it: a Python callable ``agent(task, base_url=..., api_key=...[, workspace=...])`` in a thread,
or a command in a child process (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``GYRE_TASK`` as JSON and
``GYRE_WORKSPACE`` in its environment; its last line of output, JSON, is its outcome).

The agent's first request is the episode's first observation (its messages and tools, as chat messages:
the chat template renders them, ``gyre.envs.context``); the model's turn answers it (``step(action)``:
tool calls read in ``tool_format``, ``gyre.envs.chat_api``); the next request's new messages (tool
results, a user's reply) are the next observation. The sampled tokens are kept exactly as sampled, and
what comes between them is the template's rendering of the new messages alone: nothing is tokenised
twice. When the agent returns, its outcome becomes the episode's reward (``verifier(task, outcome,
workspace)``, or the outcome itself when it is a number).

A request whose history is not the session's record (the agent edited, dropped or reordered messages the
model saw) is served anyway and counted (``agent/history_mismatch``): the model's context stays the
record, and the messages past the record's length are appended. A request that adds nothing is refused.
Temperature and top-p are the run's (counted in ``agent/sampling_overridden`` when asked otherwise); stop
strings and max_tokens apply to the turn's sampling. A request for ``n`` choices gets ``n`` samples of the
turn; the conversation goes on with the one the agent's next request carries where the model's turn was,
and that one is trained (the others are waste). An agent that ends right after may name the choice it
used (its outcome's, or its verifier's, ``"choice"``); otherwise, or when its next request carries none
of them, the first choice is kept (``agent/choice_unknown``). An agent that raises (or exits non-zero)
ends its episode with ``error_reward`` (``agent/errors``): a policy whose turns break its agent earns
nothing.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from gyre.envs.chat_api import assistant_message, extends, plain_message
from gyre.envs.endpoint import Endpoint, Pending
from gyre.envs.protocol import EnvError
from gyre.rewards.runner import die_with_parent

log = logging.getLogger(__name__)

OUTPUT_LIMIT = 1 << 20
"""Bytes of a command agent's output read (its last line is its outcome)."""


@dataclass
class _Ended:
    """The agent program returned (``outcome``) or failed (``error``)."""

    session: str
    outcome: object = None
    error: str | None = None


class AgentEnv:
    """reset(seed) / step(action) over an agent program's requests (the module docstring)."""

    def __init__(self, tasks, entry: str | None = None, command: list[str] | None = None, verifier: str | None = None,
                 tool_format: str = "auto", turn_timeout_s: float = 25.0, error_reward: float = 0.0,
                 temperature: float = 1.0, top_p: float = 1.0, workspace: dict | None = None):
        from gyre.rewards.base import load_function

        if (entry is None) == (command is None):
            raise EnvError("env.agent needs exactly one of entry (a Python callable) and command")
        self.agent = load_function(entry) if entry is not None else None
        self.command = list(command) if command is not None else None
        self.verifier = load_function(verifier) if verifier is not None else None
        self.tasks = _task_source(tasks)
        self.tool_format, self.turn_timeout_s, self.error_reward = tool_format, turn_timeout_s, error_reward
        self.workspace_limits = workspace
        self.endpoint = Endpoint(temperature, top_p, answer_timeout_s=max(600.0, 4 * turn_timeout_s))
        self.task: dict = {}
        self.record: list[dict] = []
        self.pending: Pending | None = None
        self.workspace = None
        self.counts: dict[str, float] = {}
        self._session = ""
        self._proc: subprocess.Popen | None = None

    # ---- the environment protocol ------------------------------------------------------------------
    def reset(self, seed: int | None = None):
        self._end_episode()
        self.task = self.tasks(seed or 0)
        self.counts = {"agent/requests": 0, "agent/history_mismatch": 0, "agent/sampling_overridden": 0,
                       "agent/refused": 0, "agent/errors": 0, "agent/choice_unknown": 0}
        if self.workspace_limits is not None:
            from gyre.envs.workspace import Workspace

            self.workspace = Workspace.create(self.task.get("files") or {}, **self.workspace_limits)
        self._session = self.endpoint.open()
        self._start(self._session)
        event = self._next()
        if not isinstance(event, Pending):
            reason = event.error if event.error else f"it returned {str(event.outcome)[:200]}"
            raise EnvError(f"the agent ended before it called the model: {reason}")
        self.record = list(event.request.messages)
        self._take(event)
        return self._observation(event.request.messages, event.request.tools), {}

    def step(self, action: str | list[str]):
        """Answer the waiting request with the model's turn (``n`` samples of it when the request asked for
        ``n``: a list), then wait for the agent's next request or its end."""
        actions = [action] if isinstance(action, str) else list(action)
        choices = [assistant_message(a, self.tool_format) for a in actions]
        self.pending.answer(choices)
        self.pending = None
        offered = [plain_message(message) for message, _ in choices]
        while True:
            event = self._next()
            if not isinstance(event, Pending):
                return self._finish(event, offered)
            messages = event.request.messages
            new = messages[len(self.record) + 1:]
            if not new:  # nothing to append: the model would be asked the same turn again
                self.counts["agent/refused"] += 1
                event.fail(400, f"the request's {len(messages)} messages add nothing to this session's "
                                f"{len(self.record) + 1}: a training session appends (one conversation per episode)")
                continue
            choice = self._choose(offered, messages[len(self.record)])
            self.record.append(offered[choice])
            if not extends(messages, self.record):
                self.counts["agent/history_mismatch"] += 1
            self.record += new
            self._take(event)
            return self._observation(new, None), 0.0, False, False, {"choice": choice} if len(offered) > 1 else {}

    def _choose(self, offered: list[dict], turn: dict | None, named=None) -> int:
        """Which of the offered choices the conversation went on with: the one the agent named (its outcome's
        or verifier's "choice"), else the one its next request carries where the model's turn was (the same
        text first, then the same in substance), else the first (counted: ``agent/choice_unknown``)."""
        if len(offered) == 1:
            return 0
        if type(named) is int and 0 <= named < len(offered):
            return named
        if turn is not None:
            for same in (lambda a, b: a == b, lambda a, b: extends([a], [b])):
                found = next((i for i, message in enumerate(offered) if same(turn, message)), None)
                if found is not None:
                    return found
        self.counts["agent/choice_unknown"] += 1
        return 0

    def close(self) -> None:
        self._end_episode()
        self.endpoint.close()

    # ---- internals ---------------------------------------------------------------------------------
    def _take(self, pending: Pending) -> None:
        self.pending = pending
        self.counts["agent/requests"] += 1
        self.counts["agent/sampling_overridden"] += bool(pending.request.overridden)

    def _observation(self, messages: list[dict], tools: list | None) -> dict:
        r = self.pending.request
        out: dict = {"messages": messages, "sampling": {"stop": list(r.stop), "max_tokens": r.max_tokens, "n": r.n}}
        if tools:
            out["tools"] = tools
        return out

    def _next(self):
        """The session's next request or its agent's end (what an earlier episode left is skipped)."""
        deadline = time.monotonic() + self.turn_timeout_s
        while (left := deadline - time.monotonic()) > 0:
            event = self.endpoint.next_event(left)
            if isinstance(event, Pending) and not event.done.is_set() or \
                    isinstance(event, _Ended) and event.session == self._session:
                return event
        raise TimeoutError(f"the agent neither called the model nor returned within {self.turn_timeout_s:g} s "
                           "(env.agent.turn_timeout_s)")

    def _finish(self, ended: _Ended, offered: list[dict]):
        if ended.error is not None:  # its reward is error_reward whichever choice it used: the first is kept
            self.record.append(offered[0])
            log.warning("an agent program failed: %s (its episode scores env.agent.error_reward)", ended.error)
            return "", self.error_reward, True, False, {**self.counts, "agent/errors": 1, "choice": 0}
        reward, success, named = self._score(ended.outcome)
        choice = self._choose(offered, None, named)
        self.record.append(offered[choice])
        info = {**self.counts, "choice": choice}
        if success is not None:
            info["success"] = success
        return "", reward, True, False, info

    def _score(self, outcome) -> tuple[float, bool | None, object]:
        """(reward, success, the choice named) from the verifier, or the outcome itself without one."""
        value = self.verifier(self.task, outcome, self.workspace) if self.verifier is not None else outcome
        named = next((v.get("choice") for v in (value, outcome) if isinstance(v, dict) and "choice" in v), None)
        if isinstance(value, dict) and "reward" in value:
            success = value.get("success")
            return float(value["reward"]), None if success is None else bool(success), named
        if isinstance(value, tuple) and len(value) == 2:
            return float(value[0]), bool(value[1]), named
        if isinstance(value, (int, float)):  # bool included
            return float(value), None, named
        source = "the verifier" if self.verifier is not None else "the agent (no env.agent.verifier)"
        raise EnvError(f"{source} returned {str(value)[:120]!r}: a number, (reward, success) or "
                       '{"reward": ..., "success": ...[, "choice": ...]}')

    def _start(self, session: str) -> None:
        if self.agent is not None:
            threading.Thread(target=self._run_callable, args=(session,), name="gyre-agent", daemon=True).start()
        else:
            parent = os.getpid()
            self._proc = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          stdin=subprocess.DEVNULL, env=self._command_env(session),
                                          cwd=str(self.workspace.path) if self.workspace is not None else None,
                                          start_new_session=True, preexec_fn=lambda: die_with_parent(parent))
            threading.Thread(target=self._watch_command, args=(self._proc, session), daemon=True).start()

    def _run_callable(self, session: str) -> None:
        kwargs = {"base_url": self.endpoint.url, "api_key": session}
        if self.workspace is not None and "workspace" in inspect.signature(self.agent).parameters:
            kwargs["workspace"] = self.workspace
        try:
            self.endpoint.post(_Ended(session, outcome=self.agent(self.task, **kwargs)))
        except BaseException as exc:  # noqa: BLE001 - the agent's failure ends its episode, never the worker
            self.endpoint.post(_Ended(session, error=f"{type(exc).__name__}: {str(exc)[:300]}"))

    def _command_env(self, session: str) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "GYRE_"))}
        env.update(OPENAI_BASE_URL=self.endpoint.url, OPENAI_API_KEY=session, GYRE_TASK=json.dumps(self.task))
        if self.workspace is not None:
            env["GYRE_WORKSPACE"] = str(self.workspace.path)
        return env

    def _watch_command(self, proc: subprocess.Popen, session: str) -> None:
        out = proc.stdout.read(OUTPUT_LIMIT)
        err = proc.stderr.read(OUTPUT_LIMIT)
        proc.wait()
        if proc.returncode != 0:
            tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
            self.endpoint.post(_Ended(session, error=f"exit status {proc.returncode}: {tail[0][:300]}"))
            return
        lines = out.decode("utf-8", "replace").strip().splitlines()
        try:
            outcome = json.loads(lines[-1]) if lines else None
        except ValueError:
            outcome = lines[-1]
        self.endpoint.post(_Ended(session, outcome=outcome))

    def _end_episode(self) -> None:
        """Stop what the last episode left: its session (waiting requests refused), its command, its
        workspace (removed)."""
        self.endpoint.end_session()
        self.pending = None
        if self._proc is not None and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, 9)
            except ProcessLookupError:
                pass
            self._proc.wait()
        self._proc = None
        if self.workspace is not None:
            self.workspace.remove()
            self.workspace = None


def _task_source(tasks):
    """seed -> task: a list, a JSONL file's lines (seed mod n), or a ``module:function`` of the seed."""
    if isinstance(tasks, list):
        rows = tasks
    elif isinstance(tasks, str) and tasks.endswith(".jsonl"):
        path = Path(tasks).expanduser()
        if not path.is_file():
            raise EnvError(f"env.agent.tasks: no file {tasks}")
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    elif isinstance(tasks, str):
        from gyre.rewards.base import load_function

        fn = load_function(tasks)
        return lambda seed: _task(fn(seed), tasks)
    else:
        raise EnvError(f"env.agent.tasks: a JSONL file or module:function, got {tasks!r}")
    if not rows:
        raise EnvError(f"env.agent.tasks {tasks}: no tasks")
    return lambda seed: _task(rows[seed % len(rows)], "env.agent.tasks")


def _task(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise EnvError(f"{where} gave {str(value)[:80]!r}: each task is a JSON object (a dict)")
    return value
