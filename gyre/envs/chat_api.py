"""The OpenAI chat-completions API, as far as a training session serves it: pure functions, no IO.

A request (``read_request``) is checked and reduced to what gyre uses: its messages, its tools, the stop
strings, token cap and number of choices (``n``) for this turn (the engine samples with them, so the
tokens trained are the tokens sampled), and what it asked that a training session does not do
(temperature and top-p other than the run's are served at the run's, since the policy trains on what it
sampled at those, and counted, as are what it does not do: penalties, a seed, log-probs, a forced tool
choice, a response format). A malformed request is a ``RequestError`` naming the field, never another
exception. A model turn's text becomes an assistant message
(``assistant_message``): tool calls are read in the common formats (``TOOL_FORMATS``), the text around
them is the content. ``completion`` and ``stream_chunks`` write the answer as the API's JSON, whole or as
server-sent events.

``extends`` compares a request's history with the session's record (every message so far, each model
turn as it was answered): what the client sends back may differ in form (a null content for an empty one,
arguments re-serialised), not in substance.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from dataclasses import dataclass, field

from gyre.envs.protocol import MAX_CHOICES

MAX_DEPTH = 64
"""How deep a request's lists and objects may nest (tool arguments included)."""

TOOL_FORMATS = ("auto", "hermes", "mistral", "json", "none")
"""How tool calls are read from a model turn: hermes (``<tool_call>{"name": ..., "arguments": {...}}
</tool_call>``, Qwen and Hermes templates), mistral (``[TOOL_CALLS] [{...}, ...]``), json (the whole turn
is one call or a list of calls, ``arguments`` or ``parameters``: Llama 3's JSON calling), auto (the first
of these that finds a call), none (turns are text)."""


class RequestError(ValueError):
    """A request a training session cannot serve: the answer is an HTTP 400 with this message."""


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict]
    tools: list[dict] | None
    model: str
    stream: bool
    include_usage: bool
    stop: tuple[str, ...]
    max_tokens: int | None
    overridden: tuple[str, ...] = ()
    """Sampling parameters asked for but served at the run's values (temperature, top_p, ...)."""
    n: int = 1
    """Choices asked for: each a sample of the policy; the one the agent goes on with is trained."""


@dataclass
class ToolCallText:
    name: str
    arguments: str
    """JSON text, as the API carries it."""
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")


def read_request(body: object, temperature: float, top_p: float) -> ChatRequest:
    """A chat-completions request body, checked (``RequestError`` says what is wrong)."""
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    if _depth(body) > MAX_DEPTH:  # later steps serialise what it holds (recursively)
        raise RequestError(f"the body nests deeper than {MAX_DEPTH} levels")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list")
    out = [plain_message(m) for m in messages]
    n = body.get("n")
    if n is not None and (type(n) is not int or not 1 <= n <= MAX_CHOICES):
        raise RequestError(f"n={n!r}: choices per request are 1 to {MAX_CHOICES}")
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, list | tuple) or not all(isinstance(s, str) for s in stop):
        raise RequestError(f"stop={_show(stop)}: a string or a list of strings")
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None and (type(limit) is not int or limit < 1):
        raise RequestError(f"max_tokens={_show(limit)}: a positive integer")
    tools = body.get("tools") or None
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise RequestError("tools must be a list of tool schemas (objects)")
    overridden = tuple(k for k, run in (("temperature", temperature), ("top_p", top_p))
                       if (v := _number(body, k)) is not None and abs(v - run) > 1e-9)
    overridden += tuple(k for k in ("presence_penalty", "frequency_penalty", "logit_bias", "seed", "logprobs")
                        if body.get(k) not in (None, 0, {}, False))
    if body.get("tool_choice") not in (None, "auto", "none"):  # "required" or a named tool: not enforced
        overridden += ("tool_choice",)
    response_format, stream_options = _object(body, "response_format"), _object(body, "stream_options")
    if response_format.get("type", "text") != "text":  # no constrained decoding
        overridden += ("response_format",)
    return ChatRequest(out, tools, str(body.get("model") or "gyre-policy"), bool(body.get("stream")),
                       bool(stream_options.get("include_usage")), tuple(stop), limit, overridden, n or 1)


def _number(body: dict, key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    try:
        number = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan
    except OverflowError:  # an integer of hundreds of digits
        number = math.nan
    if not math.isfinite(number):
        raise RequestError(f"{key}={_show(value)}: a finite number")
    return number


def _depth(value: object) -> int:
    """How deep ``value``'s lists and objects nest (walked without recursion)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            if level <= MAX_DEPTH:
                todo += [(v, level + 1) for v in (item.values() if isinstance(item, dict) else item)]
    return deepest


def _object(body: dict, key: str) -> dict:
    value = body.get(key) or {}
    if not isinstance(value, dict):
        raise RequestError(f"{key}={_show(value)}: an object")
    return value


def _show(value) -> str:
    return repr(value)[:80]


def plain_message(m: object) -> dict:
    """A message as the chat template takes it: text content (parts joined), tool calls with arguments as
    objects (templates render them; the API carries JSON text). ``RequestError`` for a malformed one."""
    if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
        raise RequestError(f"each message needs a role (system, user, assistant, tool): got {_show(m)}")
    role = "system" if m["role"] == "developer" else m["role"]
    content = m.get("content")
    if isinstance(content, list):  # content parts: the text ones (images are not served)
        content = "".join(p["text"] for p in content
                          if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str))
    if content is not None and not isinstance(content, str):
        raise RequestError(f"a message's content is text or a list of parts: got {_show(content)}")
    out = {"role": role, "content": content if content is not None else ""}
    calls = m.get("tool_calls")
    if role == "assistant" and calls:
        if not isinstance(calls, list) or not all(_is_call(c) for c in calls):
            raise RequestError(f"tool_calls: a list of {{'id', 'type': 'function', 'function': {{'name', "
                               f"'arguments'}}}}: got {_show(calls)}")
        out["tool_calls"] = [{"id": str(c.get("id", "")), "type": "function",
                              "function": {"name": c["function"]["name"],
                                           "arguments": _arguments(c["function"].get("arguments"))}}
                             for c in calls]
    if role == "tool":
        out["tool_call_id"] = str(m.get("tool_call_id", ""))
        if m.get("name"):
            out["name"] = str(m["name"])
    return out


def _is_call(c: object) -> bool:
    return isinstance(c, dict) and isinstance(c.get("function"), dict) and isinstance(c["function"].get("name"), str)


def _arguments(value) -> dict | str:
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):
            return value
        return parsed if _depth(parsed) <= MAX_DEPTH else value
    return value if value is not None else {}


def parse_tool_calls(text: str, fmt: str = "auto") -> tuple[str, list[ToolCallText]]:
    """``text``'s tool calls in ``fmt`` (``TOOL_FORMATS``) and the content around them. A call whose JSON
    does not parse is left in the content (the agent sees what the model wrote)."""
    if fmt == "none":
        return text, []
    for name in (("hermes", "mistral", "json") if fmt == "auto" else (fmt,)):
        content, calls = _PARSERS[name](text)
        if calls:
            return content, calls
    return text, []


def _hermes(text: str) -> tuple[str, list[ToolCallText]]:
    calls, kept = [], text
    for match in re.finditer(r"<tool_call>(.*?)</tool_call>", text, re.S):
        call = _call(match.group(1))
        if call is not None:
            calls.append(call)
            kept = kept.replace(match.group(0), "", 1)
    return kept.strip(), calls


def _mistral(text: str) -> tuple[str, list[ToolCallText]]:
    head, marker, tail = text.partition("[TOOL_CALLS]")
    if not marker:
        return text, []
    try:
        value = json.loads(tail.strip())
    except ValueError:
        return text, []
    calls = [c for c in map(_call_of, value if isinstance(value, list) else [value]) if c is not None]
    return (head.strip(), calls) if calls else (text, [])


def _json(text: str) -> tuple[str, list[ToolCallText]]:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith(("{", "[")):
        return text, []
    try:
        value = json.loads(body)
    except ValueError:
        return text, []
    values = value if isinstance(value, list) else [value]
    calls = [c for c in map(_call_of, values) if c is not None]
    return ("", calls) if calls and len(calls) == len(values) else (text, [])


def _call(body: str) -> ToolCallText | None:
    try:
        return _call_of(json.loads(body))
    except ValueError:
        return None


def _call_of(value) -> ToolCallText | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    args = value.get("arguments", value.get("parameters", {}))
    return ToolCallText(value["name"], args if isinstance(args, str) else json.dumps(args))


_PARSERS = {"hermes": _hermes, "mistral": _mistral, "json": _json}


def assistant_message(text: str, fmt: str) -> tuple[dict, str]:
    """The API's assistant message for a model turn, and its finish reason (tool_calls or stop)."""
    content, calls = parse_tool_calls(text, fmt)
    message: dict = {"role": "assistant", "content": content if content or not calls else None}
    if calls:
        message["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
    return message, "tool_calls" if calls else "stop"


def completion(choices: list[tuple[dict, str]], model: str, usage: dict | None) -> dict:
    """A whole chat.completion object: each choice's message and finish reason, in order."""
    out = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
           "model": model, "choices": [{"index": i, "message": message, "finish_reason": finish, "logprobs": None}
                                       for i, (message, finish) in enumerate(choices)]}
    if usage is not None:
        out["usage"] = usage
    return out


def stream_chunks(choices: list[tuple[dict, str]], model: str, usage: dict | None) -> list[dict]:
    """The same answer as chat.completion.chunk objects, choice after choice: the role, the content, each tool
    call, the finish reason; then the usage when asked (the turn is sampled whole first: chunks come together)."""
    base = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model}

    def chunk(index: int, delta: dict, finish_reason: str | None = None) -> dict:
        return {**base, "choices": [{"index": index, "delta": delta, "finish_reason": finish_reason,
                                     "logprobs": None}]}

    chunks = []
    for index, (message, finish) in enumerate(choices):
        chunks.append(chunk(index, {"role": "assistant", "content": ""}))
        if message.get("content"):
            chunks.append(chunk(index, {"content": message["content"]}))
        for i, call in enumerate(message.get("tool_calls", [])):
            chunks.append(chunk(index, {"tool_calls": [{"index": i, **call}]}))
        chunks.append(chunk(index, {}, finish))
    if usage is not None:
        chunks.append({**base, "choices": [], "usage": usage})
    return chunks


def extends(messages: list[dict], record: list[dict]) -> bool:
    """``messages`` begin with the session's ``record`` in substance (roles, text, tool calls' names and
    arguments); ids and the form of empty contents may differ."""
    if len(messages) < len(record):
        return False
    return all(_same(a, b) for a, b in zip(messages, record))


def _same(a: dict, b: dict) -> bool:
    if a["role"] != b["role"] or (a.get("content") or "").strip() != (b.get("content") or "").strip():
        return False
    return _calls(a) == _calls(b)


def _calls(m: dict) -> list[tuple[str, str]]:
    return [(c["function"]["name"], json.dumps(_arguments(c["function"].get("arguments")), sort_keys=True))
            for c in m.get("tool_calls") or []]
