"""Conversations grow token by token: the ids built turn by turn equal the template's rendering of the
whole conversation, with the model's turns exactly as sampled."""

import pytest

from gyre.envs.context import ContextBuilder, plain_transcript
from gyre.envs.protocol import EnvError
from gyre.models.presets import build_char_tokenizer

TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def ids(tok, text):
    return list(tok(text, add_special_tokens=False)["input_ids"])


def test_turn_by_turn_equals_the_whole_conversation_templated():
    tok = build_char_tokenizer()
    tok.chat_template = TEMPLATE
    ctx = ContextBuilder(tok, use_template=True, system="Play well.")
    first = ctx.first("start")
    reply1 = ids(tok, "\\boxed{4}") + [tok.eos_token_id]  # ended by the end-of-turn token
    reply2 = ids(tok, "\\boxed{6}")  # cut by a stop string: the turn is closed for it
    built = first + reply1 + ctx.observation(reply1, "higher") + reply2 + ctx.observation(reply2, "lower")
    whole = tok.apply_chat_template([{"role": "system", "content": "Play well."}, {"role": "user", "content": "start"},
                                     {"role": "assistant", "content": "\\boxed{4}"},
                                     {"role": "user", "content": "higher"},
                                     {"role": "assistant", "content": "\\boxed{6}"},
                                     {"role": "user", "content": "lower"}], tokenize=False,
                                    add_generation_prompt=True)
    assert built == ids(tok, whole)


def test_without_a_template_observations_sit_between_newlines():
    tok = build_char_tokenizer()
    ctx = ContextBuilder(tok, use_template=False)
    assert ctx.first("go") == list(tok("go\n")["input_ids"])  # with the special tokens the tokenizer adds
    assert ctx.observation(ids(tok, "a"), "ok") == ids(tok, "\nok\n")
    built = ctx.first("go") + ids(tok, "a") + ctx.observation(ids(tok, "a"), "ok")
    assert built == ids(tok, plain_transcript(["go", "ok"], ["a"]))


def test_a_template_that_rewrites_earlier_turns_is_refused():
    tok = build_char_tokenizer()
    tok.chat_template = ("{% for m in messages %}{% if loop.last %}{{ m.content }}{% endif %}{% endfor %}"
                         "{% if add_generation_prompt %}>{% endif %}")
    with pytest.raises(ValueError, match="rewrites earlier turns"):
        ContextBuilder(tok, use_template=True)


# A template in the style of Qwen's: tools' schemas in the system turn, consecutive tool results in one user turn.
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n{% endif %}"
    "# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' %}"
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ m.content }}\n</tool_response>"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TOOLS = [{"type": "function", "function": {"name": "python", "parameters": {"type": "object"}}}]


def test_chat_message_observations_grow_token_by_token_as_the_template_renders_them():
    """An agent's requests: system + user with tools first, then two tool results, then a user reply; the model's
    turns (a tool call and an answer) exactly as sampled."""
    tok = build_char_tokenizer()
    tok.chat_template = TOOL_TEMPLATE
    ctx = ContextBuilder(tok, use_template=True)
    first = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "6*7?"}]
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(6*7)"}}</tool_call>'
    tools_out = [{"role": "tool", "content": "42"}, {"role": "tool", "content": "ok"}]
    built = ctx.first({"messages": first, "tools": TOOLS})
    built += ids(tok, call) + ctx.observation(ids(tok, call), {"messages": tools_out})
    built += ids(tok, "42") + ctx.observation(ids(tok, "42"), {"messages": [{"role": "user", "content": "sure?"}]})
    whole = tok.apply_chat_template([*first, {"role": "assistant", "content": call}, *tools_out,
                                     {"role": "assistant", "content": "42"}, {"role": "user", "content": "sure?"}],
                                    tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert built == ids(tok, whole)
    assert "<|im_start|>user<tool_response>\n42\n</tool_response><tool_response>\nok\n</tool_response><|im_end|>" \
        in whole  # the tool results took the template's tool form, grouped in one turn
    # without a template: each message's content on a line of its own, as plain text observations are
    plain = ContextBuilder(tok, use_template=False)
    assert plain.observation(ids(tok, "a"), {"messages": tools_out}) == ids(tok, "\n42\nok\n")


def test_messages_the_template_cannot_render_are_the_environments_error_not_the_runs():
    tok = build_char_tokenizer()
    tok.chat_template = ("{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
                         "{{ raise_exception('System message must be first') }}{% endif %}"
                         "<{{ m.role }}>{{ m.content }}</s>\n{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    ctx = ContextBuilder(tok, use_template=True)
    late_system = {"messages": [{"role": "user", "content": "q"}, {"role": "system", "content": "now"}]}
    with pytest.raises(EnvError, match="System message must be first"):
        ctx.first(late_system)
    with pytest.raises(EnvError, match="cannot render these messages"):
        ctx.observation(ids(tok, "a"), {"messages": [{"role": "system", "content": "late"}]})
