"""The reward-function contract and how a config names one.

A reward function is any callable ``fn(response: str, ground_truth: str, **kwargs) -> float | bool |
RewardResult``; it may also accept ``prompt`` and ``tag`` keyword arguments. A config names it as
"package.module:function" or "path/to/file.py:function".
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import numbers
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gyre.types import RewardResult

RewardFn = Callable[..., object]

@dataclass
class RewardRequest:
    """What a reward function sees for one sample."""

    response: str
    ground_truth: str
    prompt: str = ""
    """The question as written in the data (the user's text, without the chat template)."""
    tag: str | None = None
    options: dict = field(default_factory=dict)
    """Per-request keyword arguments on top of the domain's (e.g. an adaptive code timeout)."""


_IMPORTING = threading.Lock()


class RewardSpecError(ValueError):
    """reward.function cannot be imported or is not callable."""


def load_function(spec: str) -> RewardFn:
    """Import ``module:function`` or ``file.py:function``; an import that fails (syntax error, an
    exception at import time) is a RewardSpecError naming the file, line and error."""
    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise RewardSpecError(
            f'reward function {spec!r} must look like "package.module:function" or "file.py:function"')
    if target.endswith(".py"):
        module = _import_file(target)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise RewardSpecError(f"cannot import module {target!r} of reward function {spec!r}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - the user's module failed at import: say where
            raise RewardSpecError(_import_failure(target, exc)) from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise RewardSpecError(f"{target!r} has no callable named {name!r} (reward function {spec!r})")
    return fn


def _import_file(target: str):
    path = Path(target).expanduser().resolve()
    if not path.is_file():
        raise RewardSpecError(f"reward function file {target} does not exist")
    mod_name = f"gyre_user_reward_{abs(hash(str(path)))}"
    with _IMPORTING:  # another thread must not find the module half run (in-process reward workers)
        return sys.modules.get(mod_name) or _exec_file(mod_name, path)


def _exec_file(mod_name: str, path: Path):
    loader_spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[mod_name] = module
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's file failed at import: say where
        del sys.modules[mod_name]  # a later load must run the file again, not find half a module
        raise RewardSpecError(_import_failure(str(path), exc, path)) from None
    return module


def _import_failure(target: str, exc: BaseException, path: Path | None = None) -> str:
    """One paragraph: which file and line failed, and with what error."""
    if isinstance(exc, SyntaxError):
        where = f"{exc.filename or target}, line {exc.lineno}"
        return (f"reward function file {where}: {type(exc).__name__}: {exc.msg}. Fix the file, then check it with "
                "gyre check.")
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if path is None or Path(f.filename) == path] or frames
    where = f"{mine[-1].filename}, line {mine[-1].lineno}" if mine else target
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return (f"importing reward function module {target} failed at {where}: {type(exc).__name__}"
            f"{': ' + message[:300] if message else ''}. Fix the module, then check it with gyre check.")


def call_reward(fn: RewardFn, request: RewardRequest, kwargs: dict) -> RewardResult:
    """Call ``fn`` with the arguments it accepts and normalise its return value."""
    extra = {**kwargs, **request.options}
    params = inspect.signature(fn).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for key in ("prompt", "tag"):
        if takes_any or key in params:
            extra[key] = getattr(request, key)
    value = fn(request.response, request.ground_truth, **extra)
    return to_result(value)


def to_result(value: object) -> RewardResult:
    """A RewardResult from what a reward function returned: a RewardResult, a bool or any real number
    (Python, numpy or 0-dim torch). NaN and infinities are rejected: one would poison a whole group's
    advantages."""
    if isinstance(value, RewardResult):
        score = value.score
    elif isinstance(value, bool):
        return RewardResult(score=float(value), correct=value)
    elif isinstance(value, numbers.Real) or hasattr(value, "__float__") and not isinstance(value, (str, bytes)):
        score = float(value)  # type: ignore[arg-type]
        value = RewardResult(score=score)
    else:
        raise TypeError(f"reward function returned {type(value).__name__}; return a float, a bool or a RewardResult")
    if not math.isfinite(score):
        raise ValueError(f"reward function returned {score}; rewards must be finite")
    return value
