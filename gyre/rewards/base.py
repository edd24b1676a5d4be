"""The reward-function contract and how a config names one.

A reward function is any callable ``fn(response: str, ground_truth: str, **kwargs) -> float | bool |
RewardResult``, or a TRL reward function ``fn(completions, **kwargs) -> list[float]`` (known by its
``completions`` parameter; it gets one-item lists: ``completions``, ``prompts``, each data column and
``ground_truth``). A config names it as "package.module:function" or "path/to/file.py:function".

Keyword arguments, as in TRL, are the prompt row's data columns other than the prompt, answer and tag
(``PromptRecord.columns``), then ``prompt`` (the question as written) and ``tag``. A function gets
only the names its signature takes (or all of them with ``**kwargs``), so one written for other data
keeps working. The domain's configured ``kwargs`` and per-request options override a column of the
same name. Columns named ``response``, ``ground_truth``, ``prompt`` or ``tag``, or like the function's
first two parameters (which take the response and ground truth by position), are never passed.
"""

from __future__ import annotations

import functools
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
    columns: dict = field(default_factory=dict)
    """The prompt row's other data columns; each is passed when the function takes its name."""
    messages: list | None = None
    """The prompt as the data's chat, when it was one (``PromptRecord.messages``)."""


RESERVED = frozenset({"response", "ground_truth", "prompt", "tag"})
"""Argument names that carry gyre's values; data columns with these names are not passed."""


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
    """Call ``fn`` with the arguments it accepts and normalise its return value. A function marked
    ``takes_request`` (a composite such as ``shaped_reward``) gets the request itself and routes it; a
    TRL-style batched function (``batched``) gets one-sample lists."""
    if getattr(fn, "takes_request", False):
        return to_result(fn(request, **kwargs))
    if batched(fn):
        return _call_batched(fn, request, kwargs)
    takes = keyword_filter(fn)
    extra = {k: v for k, v in request.columns.items() if k not in RESERVED and takes(k)}
    extra.update(kwargs)
    extra.update(request.options)
    for key in ("prompt", "tag"):
        if takes(key):
            extra[key] = getattr(request, key)
    value = fn(request.response, request.ground_truth, **extra)
    return to_result(value)


def batched(fn: RewardFn) -> bool:
    """Whether ``fn`` is a TRL reward function: it takes ``completions`` (a list of texts) by name, the data
    columns and ``prompts`` as lists, and returns one score per completion (inspected once per function)."""
    return _inspected(_batched, fn)


@functools.lru_cache(maxsize=256)
def _batched(fn: RewardFn) -> bool:
    try:
        return "completions" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _call_batched(fn: RewardFn, request: RewardRequest, kwargs: dict) -> RewardResult:
    """A TRL reward function on one sample: ``completions=[response]``, ``prompts=[prompt]`` (for a chat
    prompt, TRL's conversational form: the prompt's messages and ``[{"role": "assistant", "content":
    response}]``), every data column as a one-item list (the answer column as written, and
    ``ground_truth``), then the domain's kwargs and the request's options as they are; its one score is
    the result."""
    takes = keyword_filter(fn, positional=0)  # TRL passes everything by name
    # Conversational data as TRL passes it: the prompt's messages, the completion as an assistant message.
    chat = request.messages is not None
    completion = [{"role": "assistant", "content": request.response}] if chat else request.response
    columns = {**request.columns, "ground_truth": request.ground_truth,
               "prompts": request.messages if chat else request.prompt}
    extra = {k: [v] for k, v in columns.items() if k not in ("completions", "tag") and takes(k)}
    extra.update({k: v for k, v in {**kwargs, **request.options}.items() if takes(k)})
    value = fn(completions=[completion], **extra)
    if not isinstance(value, (list, tuple)) or len(value) != 1:
        got = f"{len(value)} values" if isinstance(value, (list, tuple)) else type(value).__name__
        raise TypeError(f"reward function takes completions (a TRL batched reward), so it must return a list with "
                        f"one score per completion: given 1 completion, it returned {got}")
    if value[0] is None:
        raise TypeError("reward function returned [None] (TRL's 'does not apply'); return a score for every "
                        "completion of this domain, or route the rows it does not score to another reward domain")
    return to_result(value[0])


def keyword_filter(fn: RewardFn, positional: int = 2) -> Callable[[str], bool]:
    """Whether ``fn`` takes a keyword argument of a given name (any name with ``**kwargs``); its first
    ``positional`` parameters are gyre's to fill by position (the response and the ground truth)."""
    names = _inspected(_keywords, fn, positional)
    return (lambda _: True) if names is None else names.__contains__


def _inspected(cached, fn: RewardFn, *args):
    """``cached(fn, *args)``, an lru-cached inspection; an unhashable callable object is inspected every time."""
    try:
        return cached(fn, *args)
    except TypeError:
        return cached.__wrapped__(fn, *args)


@functools.lru_cache(maxsize=256)
def _keywords(fn: RewardFn, positional: int = 2) -> frozenset[str] | None:
    """The names ``fn`` takes as keywords, None for any (``**kwargs``); inspected once per function."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read (some builtins): pass no extras
        return frozenset()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    # The first ``positional`` take the response and the ground truth by position, whatever their names.
    return frozenset(p.name for p in params[positional:]
                     if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY))


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
