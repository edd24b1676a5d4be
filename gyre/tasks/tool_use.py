"""The tool-use quickstart: an agent program (the openai client and a calculator tool) trained through
gyre's endpoint, and the warm-up conversations that teach its formats.

A task asks for a product ("37*8=?") that the tiny model cannot compute; the agent offers one tool,
``mul(a, b)``. The model may call it (its turn is the call, ``{"name":"mul","arguments":{"a":37,"b":8}}``:
the JSON tool-call format), read the result the agent sends back as a tool message, and answer; the agent
returns what it answered and ``verify`` scores it (1 for the product).

The warm-up conversations are played by a policy that answers directly most of the time, with a wrong
rule of thumb (the first factor with a 0 appended: "370"), and otherwise calls the tool, copying the
factors and then the result with some slips. It teaches the formats and leaves the choice to RL: the
warm-up's greedy play guesses (and fails); calling the tool is what the reward favours.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
"""The quickstart model's chat template: every role's message between tags (tool results included)."""
TOOLS = [{"type": "function", "function": {
    "name": "mul", "description": "Multiply two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]


@dataclass(frozen=True)
class ToolSpec:
    conversations: int = 3000
    guess_share: float = 0.6
    """Warm-up conversations that answer directly (by the wrong rule of thumb)."""
    slip: float = 0.15
    """Chance a copied number (a factor, the result) is mistyped in a warm-up conversation."""
    seed: int = 1234


def task(seed: int) -> dict:
    """Episode ``seed``'s product: a two-digit number times a digit."""
    rng = random.Random(seed)
    a, b = rng.randint(10, 99), rng.randint(2, 9)
    return {"question": f"{a}*{b}=?", "a": a, "b": b, "answer": str(a * b)}


def call_text(a, b) -> str:
    """A tool call as the warm-up writes it (and the model learns to): the whole turn is the call's JSON (the
    json format, Llama 3's way; ``env.agent.tool_format: json``)."""
    return json.dumps({"name": "mul", "arguments": {"a": a, "b": b}}, separators=(",", ":"))


def agent(task: dict, base_url: str, api_key: str) -> dict:
    """An ordinary tool loop on the openai client: ask, run the tool calls, ask again; stop at an answer."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
    messages: list = [{"role": "user", "content": task["question"]}]
    for _ in range(3):
        message = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return {"answer": (message.content or "").strip()}
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": _run_tool(call.function)})
    return {"answer": ""}


def _run_tool(function) -> str:
    try:
        args = json.loads(function.arguments)
        if function.name != "mul":
            return f"error: no tool {function.name}"
        return str(int(args["a"]) * int(args["b"]))
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: {type(exc).__name__}"


def verify(task: dict, outcome: dict, workspace=None) -> dict:
    correct = isinstance(outcome, dict) and outcome.get("answer") == task["answer"]
    return {"reward": float(correct), "success": correct}


def write_tool_task(out_dir: str | Path, spec: ToolSpec = ToolSpec()) -> dict[str, Path]:
    """Write sft.jsonl: warm-up conversations ({"messages": [...]}) over seeds no run trains or validates on."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(spec.seed)
    rows = []
    for i in range(spec.conversations):
        t = task(10_000_000 + i)
        messages = [{"role": "user", "content": t["question"]}]
        if rng.random() < spec.guess_share:
            messages.append({"role": "assistant", "content": f"{t['a']}0"})
        else:
            a, b = _slip(rng, t["a"], spec.slip), _slip(rng, t["b"], spec.slip)
            result = a * b
            messages += [{"role": "assistant", "content": call_text(a, b)}, {"role": "tool", "content": str(result)},
                         {"role": "assistant", "content": str(_slip(rng, result, spec.slip))}]
        rows.append({"messages": messages})
    path = out / "sft.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"sft": path}


def _slip(rng: random.Random, value: int, chance: float) -> int:
    """``value``, or with ``chance`` one of its digits mistyped."""
    if rng.random() >= chance:
        return value
    digits = list(str(value))
    i = rng.randrange(len(digits))
    digits[i] = str((int(digits[i]) + rng.randint(1, 9)) % 10) if i or len(digits) == 1 else str(rng.randint(1, 9))
    return int("".join(digits))
