"""The tool-use quickstart: its warm-up conversations render as a run's episodes do, and its agent (the openai
client and a calculator tool) pays the product only when the model's call and copy are right."""

import json

import pytest

pytest.importorskip("openai")

from gyre.envs.agent import AgentEnv  # noqa: E402
from gyre.envs.context import ContextBuilder  # noqa: E402
from gyre.envs.protocol import check_reset, check_step  # noqa: E402
from gyre.models.presets import build_char_tokenizer  # noqa: E402
from gyre.tasks.tool_use import TEMPLATE, ToolSpec, call_text, task, write_tool_task  # noqa: E402


def env():
    return AgentEnv("gyre.tasks.tool_use:task", entry="gyre.tasks.tool_use:agent",
                    verifier="gyre.tasks.tool_use:verify", tool_format="json", turn_timeout_s=20.0)


def test_calling_the_tool_and_copying_its_result_scores_and_guessing_does_not():
    e = env()
    try:
        t = task(7)
        obs = check_reset(e.reset(7)).observation
        assert obs["messages"] == [{"role": "user", "content": t["question"]}]
        assert obs["tools"][0]["function"]["name"] == "mul"
        tool = check_step(e.step(call_text(t["a"], t["b"]))).observation["messages"]
        assert tool[0]["role"] == "tool" and tool[0]["content"] == t["answer"]
        assert check_step(e.step(t["answer"])).reward == 1.0
        e.reset(7)
        assert check_step(e.step(f"{t['a']}0")).reward == 0.0  # the warm-up's rule of thumb
        e.reset(7)
        assert check_step(e.step('{"name":"mul","arguments":{"a":')).reward == 0.0  # broken JSON is text
    finally:
        e.close()


def test_warm_up_conversations_render_as_the_runs_episodes(tmp_path):
    rows = [json.loads(line) for line in write_tool_task(tmp_path, ToolSpec(conversations=200))["sft"]
            .read_text().splitlines()]
    tools = [r for r in rows if len(r["messages"]) == 4]
    assert 50 < len(tools) < 130 and len(rows) == 200  # 60% guess
    tok = build_char_tokenizer()
    tok.chat_template = TEMPLATE
    ctx = ContextBuilder(tok, use_template=True)
    user, call, result, answer = tools[0]["messages"]
    ids = ctx.first({"messages": [user]}) + list(tok(call["content"], add_special_tokens=False)["input_ids"])
    ids += [tok.eos_token_id] + ctx.observation([tok.eos_token_id], {"messages": [result]})
    assert ids == list(tok(tok.apply_chat_template([user, call, result], tokenize=False, add_generation_prompt=True),
                           add_special_tokens=False)["input_ids"])
    assert json.loads(call["content"])["name"] == "mul"
