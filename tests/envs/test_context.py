"""Conversations grow token by token: the ids built turn by turn equal the template's rendering of the
whole conversation, with the model's turns exactly as sampled."""

import pytest

from gyre.envs.context import ContextBuilder, plain_transcript
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
