"""Tools an agent can call mid-episode, and the wrapper that gives an environment tools.

A tool call in the model's turn is answered by the tool, not the environment: its output comes back as
the next observation (tokens the model never trains on), reward 0, and the episode goes on. A turn
with no tool call is the environment's action. Two call formats:

- ``tags``: ``<python>print(2 + 2)</python>`` (the tag is the tool's name);
- ``json``: ``<tool_call>{"name": "python", "arguments": {"code": "print(2 + 2)"}}</tool_call>``.

``PythonTool`` runs the code in the reward sandbox (``gyre.rewards.sandbox``: the same kernel
containment as code rewards), so a model's program cannot touch the host either.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal

ToolFormat = Literal["tags", "json"]


@dataclass(frozen=True)
class ToolCall:
    name: str
    argument: str
    """The tool's input (for ``python``: the program)."""


def parse_tool_call(action: str, names: list[str], fmt: ToolFormat) -> ToolCall | None | str:
    """The first tool call in ``action``: a ``ToolCall``, None when there is none, or a message saying what
    is wrong with a call that is there but cannot be used (unknown tool, bad JSON)."""
    if fmt == "tags":
        for name in names:
            found = re.search(rf"<{re.escape(name)}>(.*?)</{re.escape(name)}>", action, re.S)
            if found:
                return ToolCall(name, found.group(1).strip("\n"))
        return None
    found = re.search(r"<tool_call>(.*?)</tool_call>", action, re.S)
    if not found:
        return None
    try:
        call = json.loads(found.group(1))
        name, args = call["name"], call.get("arguments", {})
    except (ValueError, KeyError, TypeError):
        return 'a tool call must be JSON like {"name": "python", "arguments": {"code": "..."}}'
    if name not in names:
        return f"no tool named {name!r}: the tools are {names}"
    argument = args.get("code", "") if isinstance(args, dict) else str(args)
    return ToolCall(name, str(argument))


class PythonTool:
    """Runs a program in the code sandbox and answers with what it printed (stderr's tail on failure)."""

    name = "python"

    def __init__(self, timeout_s: float = 5.0, memory_mb: int = 512, max_output_chars: int = 2000,
                 allow_weak: bool = False):
        from gyre.rewards.sandbox import SandboxLimits

        self.limits = SandboxLimits(cpu_s=timeout_s, wall_s=2 * timeout_s + 2, memory_mb=memory_mb)
        self.max_chars, self.allow_weak = max_output_chars, allow_weak

    def __call__(self, code: str) -> str:
        from gyre.rewards.sandbox import run_python

        outcome = run_python(code, limits=self.limits, allow_weak=self.allow_weak)
        text = outcome.stdout
        if outcome.status != "ok":
            last = outcome.stderr.strip().splitlines()[-1:]
            text += f"\n[{outcome.status}] {last[0] if last else ''}".rstrip()
        return text[:self.max_chars]


TOOLS = {"python": PythonTool}
"""Tools by the name a config gives them."""


class ToolEnv:
    """An environment with tools: a turn that calls a tool gets the tool's output; any other turn goes to
    the environment. At most ``max_tool_calls`` per episode (then calls are refused and count as turns)."""

    def __init__(self, env, tools: list, fmt: ToolFormat = "tags", max_tool_calls: int = 4):
        self.env, self.tools, self.fmt, self.max_tool_calls = env, {t.name: t for t in tools}, fmt, max_tool_calls
        self.calls = 0

    def reset(self, seed: int | None = None):
        from gyre.envs.protocol import call

        self.calls = 0
        obs, info = call(self.env.reset, seed)
        return obs + "\n" + self.usage(), info

    def usage(self) -> str:
        name = next(iter(self.tools))
        if self.fmt == "tags":
            return f"You may run Python by writing <{name}>print(1 + 1)</{name}>; you will see its output."
        return ('You may call a tool by writing <tool_call>{"name": "python", "arguments": {"code": '
                '"print(1 + 1)"}}</tool_call>; you will see its output.')

    def step(self, action: str):
        from gyre.envs.protocol import call

        found = parse_tool_call(action, list(self.tools), self.fmt)
        if found is None:
            return call(self.env.step, action)
        if self.calls >= self.max_tool_calls:
            used_up = f"Tool calls are used up ({self.max_tool_calls}); answer now."
            return used_up, 0.0, False, False, {"tool": "refused"}
        self.calls += 1
        if isinstance(found, str):
            return f"Tool error: {found}", 0.0, False, False, {"tool": "error"}
        return f"Output:\n{self.tools[found.name](found.argument)}", 0.0, False, False, {"tool": found.name}

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()
