"""Agent programs written as users write them: the openai client, a tool loop, a task in and an outcome out."""

import json
import os
import sys

from openai import OpenAI

TOOLS = [{"type": "function", "function": {
    "name": "python", "description": "Run Python in the workspace; see what it prints.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}]


def tasks(seed: int) -> dict:
    a, b = 3 + seed % 5, 4 + seed % 7
    return {"question": f"What is {a} * {b}?", "answer": str(a * b), "files": {"notes.txt": f"{a} {b}\n"}}


def tool_agent(task, base_url, api_key, workspace=None, stream=False):
    """Asks the model, runs its python calls in the workspace, stops at an answer without a call."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "system", "content": "Answer with a number. You may use python."},
                {"role": "user", "content": task["question"]}]
    for _ in range(6):
        if stream:
            message = _streamed(client, messages)
        else:
            reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, stop=["</answer>"])
            message = reply.choices[0].message.model_dump(exclude_none=True)
        messages.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            return {"answer": (message.get("content") or "").strip()}
        for call in calls:
            code = json.loads(call["function"]["arguments"]).get("code", "")
            output = workspace.run_python(code).output if workspace is not None else "no workspace"
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
    return {"answer": ""}


def _streamed(client, messages) -> dict:
    content, calls = "", {}
    for chunk in client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, stream=True):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for c in choice.delta.tool_calls or []:
                calls[c.index] = {"id": c.id, "type": "function",
                                  "function": {"name": c.function.name, "arguments": c.function.arguments}}
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def stream_agent(task, base_url, api_key, workspace=None):
    return tool_agent(task, base_url, api_key, workspace, stream=True)


def verify(task, outcome, workspace):
    correct = outcome.get("answer") == task["answer"]
    return {"reward": float(correct), "success": correct}


def broken_agent(task, base_url, api_key):
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task["question"]}])
    raise RuntimeError("the agent could not read the model's answer")


def editing_agent(task, base_url, api_key):
    """Rewrites its history before the second call (as context compaction does)."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "user", "content": task["question"]}]
    first = client.chat.completions.create(model="policy", messages=messages).choices[0].message.content
    messages += [{"role": "assistant", "content": first + " (edited)"}, {"role": "user", "content": "sure?"}]
    second = client.chat.completions.create(model="policy", messages=messages).choices[0].message.content
    return float(second == task["answer"])


def best_of_agent(task, base_url, api_key, stream=False):
    """Asks for three choices, goes on with the first right one (the last if none is), asks "sure?" and
    scores the reply; a task with "stop_after_choices" returns right after the choices."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "user", "content": task["question"]}]
    if stream:
        texts = {}
        for chunk in client.chat.completions.create(model="policy", messages=messages, n=3, stream=True):
            for choice in chunk.choices:
                texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
        answers = [texts[i] for i in sorted(texts)]
    else:
        answers = [c.message.content for c in
                   sorted(client.chat.completions.create(model="policy", messages=messages, n=3).choices,
                          key=lambda c: c.index)]
    if task.get("stop_after_choices"):  # it says which it used, when the task asks it to
        named = {"choice": answers.index(task["name"])} if "name" in task else {}
        return {"reward": float(len(answers) == 3), **named}
    chosen = next((a for a in answers if a.strip() == task["answer"]), answers[-1])
    messages += [{"role": "assistant", "content": chosen}, {"role": "user", "content": "sure?"}]
    final = client.chat.completions.create(model="policy", messages=messages).choices[0].message.content
    return float(final.strip() == task["answer"])


if __name__ == "__main__":  # the command form: the task and endpoint from the environment, the outcome printed
    import tempfile
    import time

    task = json.loads(os.environ["GYRE_TASK"])
    if "hang" in sys.argv:  # run in an environment slot: its temp dir is the slot's private scratch
        with open(os.path.join(tempfile.gettempdir(), "agent.pid"), "w") as f:
            f.write(str(os.getpid()))
    client = OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    reply = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task["question"]}])
    print("thinking...", file=sys.stderr)
    if "hang" in sys.argv:
        time.sleep(3600)
    print(json.dumps({"answer": reply.choices[0].message.content, "cwd": os.getcwd()}))


def two_turn_agent(task, base_url, api_key, n=1):
    """Asks, asks again to check, and scores the second answer: two model turns per episode. With ``n``, the
    first question asks for n choices and the agent goes on with the last."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "user", "content": task["question"]}]
    for follow_up in ("Check it.", None):
        choices = client.chat.completions.create(model="policy", messages=messages, n=n if follow_up else 1).choices
        reply = max(choices, key=lambda c: c.index).message
        messages.append(reply.model_dump(exclude_none=True))
        if follow_up:
            messages.append({"role": "user", "content": follow_up})
    return float(messages[-1].get("content", "").strip() == task["answer"])


def last_of_3_agent(task, base_url, api_key):
    return two_turn_agent(task, base_url, api_key, n=3)


def sleepy_agent(task, base_url, api_key, workspace=None):
    """Calls the model once, then never returns (a hung tool)."""
    import time

    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task["question"]}])
    time.sleep(3600)
