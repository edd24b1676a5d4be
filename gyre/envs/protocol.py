"""The environment contract (GEM's), how a config names an environment, and what a step must return.

An environment is any object with

    reset(seed: int | None = None) -> (observation, info: dict)
    step(action: str) -> (observation, reward: float, terminated: bool, truncated: bool, info: dict)

An observation is text (the next user message) or chat messages, ``{"messages": [{"role": "tool",
"content": ...}, ...]}`` (roles system, user, tool, assistant; a reset's may add ``"tools"``: the tools'
JSON schemas, which the chat template renders; and ``"sampling": {"stop": [...], "max_tokens": m, "n": k}``
for the next turn alone): what an agent program's requests carry (``gyre.envs.agent``), appended to the
conversation by the chat template as they are. An observation asking ``n`` = k > 1 gets k samples of the
turn as its action (a list of k strings, in sample order), and the step's ``info["choice"]`` names the one
the conversation went on with: that one is trained, the others are counted as waste (0 when not said).

(``async def`` versions are awaited), optionally ``close()``. A config names one as

- ``gyre:<name>``: a built-in environment (``BUILTIN``); ``gyre:agent`` is an agent program talking to the
  policy through an OpenAI-compatible endpoint (``env.agent``, ``gyre.envs.agent``);
- ``gem:<id>``: a gem-llm environment by id, e.g. ``gem:game:GuessTheNumber-v0-easy`` (the ``gem`` extra);
- ``package.module:Class`` or ``path/to/file.py:Class``: a class of your own (any callable returning an
  environment: a factory function works too).

An environment's own code may raise, hang or return junk: ``check_reset`` / ``check_step`` turn what it
returned into typed records or an ``EnvError`` saying what was wrong, and the host (``gyre.envs.host``)
turns a raise, a crash or a missed deadline into one failed trajectory.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

MAX_CHOICES = 16
"""Most samples (``sampling.n``) one turn may ask for."""

BUILTIN: dict[str, str] = {
    "guess_number": "gyre.envs.builtin.guess:GuessNumber",
    "frozen_lake": "gyre.envs.builtin.frozen_lake:FrozenLake",
    "sokoban": "gyre.envs.builtin.sokoban:Sokoban",
    "python_math": "gyre.envs.builtin.python_math:PythonMath",
    "agent": "gyre.envs.agent:AgentEnv",
}
"""Built-in environments by the name ``gyre:<name>`` takes."""


FailureKind = Literal["error", "invalid", "timeout", "crashed"]


@dataclass(frozen=True)
class EnvFailure:
    """A reset or step that did not give a valid answer: the trajectory it belongs to is dropped."""

    kind: FailureKind
    """error: it raised; invalid: it returned something that is not a reset / step; timeout: it ran past its
    deadline (the child was killed); crashed: its process died."""
    message: str


class EnvError(ValueError):
    """An environment cannot be made, or returned something that is not a valid reset / step."""


ROLES = ("system", "user", "tool", "assistant")
"""Roles a structured observation's messages may have."""


@dataclass
class EnvReset:
    observation: str | dict
    """Text, or ``{"messages": [...], "tools": [...]}`` (module docstring)."""
    info: dict = field(default_factory=dict)


@dataclass
class EnvStep:
    """One environment transition: what the agent sees next and what its action earned."""

    observation: str | dict
    """Text, or ``{"messages": [...]}`` (module docstring)."""
    reward: float
    terminated: bool
    """The episode reached a terminal state of the task (won, lost)."""
    truncated: bool
    """The episode was cut outside the task's own rules (a turn limit)."""
    info: dict = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


def make_env(spec: str, kwargs: dict | None = None):
    """The environment ``spec`` names (see the module docstring), built with ``kwargs``."""
    kwargs = dict(kwargs or {})
    if spec.startswith("gyre:"):
        name = spec[len("gyre:"):]
        if name not in BUILTIN:
            raise EnvError(f"no built-in environment {name!r}: choose one of {sorted(BUILTIN)}")
        factory = _load(BUILTIN[name])
    elif spec.startswith("gem:"):
        from gyre.envs.gem import make_gem

        return make_gem(spec[len("gem:"):], kwargs)
    else:
        factory = _load(spec)
    try:
        env = factory(**kwargs)
    except Exception as exc:  # noqa: BLE001 - the user's constructor refused its arguments: say which
        raise EnvError(f"environment {spec!r} cannot be built with {kwargs}: {type(exc).__name__}: {exc}") from None
    for method in ("reset", "step"):
        if not callable(getattr(env, method, None)):
            raise EnvError(f"environment {spec!r} has no {method}() method: an environment needs reset(seed) and "
                           "step(action)")
    return env


def _load(spec: str) -> Callable:
    from gyre.rewards.base import RewardSpecError, load_function

    try:
        return load_function(spec)
    except RewardSpecError as exc:
        raise EnvError(str(exc).replace("reward function", "environment")) from None


def call(method, *args):
    """Call an environment method, awaiting it when it is a coroutine function."""
    out = method(*args)
    return asyncio.run(out) if inspect.isawaitable(out) else out


def check_reset(value) -> EnvReset:
    if not (isinstance(value, tuple) and len(value) == 2):
        raise EnvError(f"reset() must return (observation, info), got {_show(value)}")
    obs, info = value
    return EnvReset(_observation(obs, "reset"), _info(info, "reset"))


def check_step(value) -> EnvStep:
    if not (isinstance(value, tuple) and len(value) == 5):
        raise EnvError(f"step() must return (observation, reward, terminated, truncated, info), got {_show(value)}")
    obs, reward, terminated, truncated, info = value
    try:
        reward = float(reward) if not isinstance(reward, (str, bytes)) else math.nan
    except (TypeError, ValueError):
        reward = math.nan
    if not math.isfinite(reward):
        raise EnvError(f"step() returned reward {_show(value[1])}: it must be a finite number")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(flag, bool) and type(flag).__name__ != "bool_":
            raise EnvError(f"step() returned {name}={_show(flag)}: it must be a bool")
    return EnvStep(_observation(obs, "step"), reward, bool(terminated), bool(truncated), _info(info, "step"))


def _observation(obs, where: str) -> str | dict:
    if isinstance(obs, str):
        return obs
    if not isinstance(obs, dict) or not isinstance(obs.get("messages"), list):
        raise EnvError(f"{where}() returned observation {_show(obs)}: return a str, or a dict of chat messages "
                       '{"messages": [{"role": "user", "content": "..."}]}')
    unknown = set(obs) - {"messages", "tools", "sampling"}
    if unknown or ("tools" in obs and (where != "reset" or not isinstance(obs["tools"], list))):
        raise EnvError(f"{where}() returned observation keys {sorted(obs)}: messages, sampling, and for reset() a "
                       "list of tools")
    sampling = obs.get("sampling") or {}
    if not isinstance(sampling, dict) or set(sampling) - {"stop", "max_tokens", "n"} or \
            not (isinstance(stop := sampling.get("stop") or [], list) and all(isinstance(s, str) for s in stop)) or \
            not all(v is None or type(v) is int and v > 0 for v in (sampling.get("max_tokens"), sampling.get("n"))) \
            or (sampling.get("n") or 1) > MAX_CHOICES:
        raise EnvError(f"{where}() returned sampling {_show(sampling)}: "
                       f'{{"stop": [str, ...], "max_tokens": a positive int or None, "n": 1 to {MAX_CHOICES}}}')
    for m in obs["messages"]:
        if not (isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content", ""), (str, type(None)))):
            raise EnvError(f"{where}() returned message {_show(m)}: each is a dict with a role ({', '.join(ROLES)}) "
                           "and str content")
    return obs


def cut_messages(obs: dict, max_chars: int) -> dict:
    """``obs`` with its messages' contents cut, in order, to ``max_chars`` characters in all (the tools kept)."""
    left, messages = max_chars, []
    for m in obs["messages"]:
        content = (m.get("content") or "")[:max(0, left)]
        left -= len(content)
        messages.append({**m, "content": content})
    return {**obs, "messages": messages}


def observation_text(obs: str | dict) -> str:
    """An observation as text: itself, or its messages' contents (what limits, keys and logs read)."""
    if isinstance(obs, str):
        return obs
    return "\n".join(m.get("content") or "" for m in obs["messages"])


def _info(info, where: str) -> dict:
    if info is None:
        return {}
    if not isinstance(info, dict):
        raise EnvError(f"{where}() returned info {_show(info)}: it must be a dict")
    return {str(k): v for k, v in info.items() if isinstance(v, (str, int, float, bool)) or v is None}


def _show(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:80]}{'...' if len(text) > 80 else ''}"
