"""SFT rows: pairs and conversations as masked tokens (assistant turns only), padded and packed batches."""

import json

import pytest
import torch

from gyre.data.batching import collate
from gyre.data.prompts import DataError, PromptRenderer
from gyre.data.sft import SFTColumns, SFTExample, load_sft_examples, pack_rows, sft_batch
from gyre.models.loading import load_tokenizer

# Assistant turns end with the EOS token, as chat templates end them with their end-of-turn token.
TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% if m.role == 'assistant' %}</s>{% endif %}"
            "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
# A template that writes only the last assistant message in full (as reasoning templates drop old thoughts).
REWRITING = ("{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' and not loop.last %}...{% else %}"
             "{{ m.content }}{% endif %}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
CHAT = [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"},
        {"role": "user", "content": "3+3="}, {"role": "assistant", "content": "6"}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def chat_renderer(tokenizer, template=TEMPLATE, **kwargs):
    """A renderer over a copy of ``tokenizer`` that has the chat template ``template``."""
    import copy

    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = template
    return PromptRenderer(tokenizer, "auto", **kwargs)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def trained_text(tokenizer, example):
    return [tokenizer.decode([i]) for i, m in zip(example.input_ids, example.loss_mask) if m]


def test_a_pair_trains_the_response_and_eos(tmp_path, tokenizer):
    f = write_jsonl(tmp_path / "s.jsonl", [{"prompt": "1+2=", "response": "3"}])
    (ex,), dropped = load_sft_examples([f], PromptRenderer(tokenizer), eos_id=2, max_tokens=32)
    assert dropped == 0 and ex.prompt_length == 4
    assert tokenizer.decode(ex.input_ids[:4]) == "1+2="
    assert ex.input_ids[4:] == [tokenizer.convert_tokens_to_ids("3"), 2]
    assert ex.loss_mask == [0, 0, 0, 0, 1, 1]


def test_a_conversation_trains_every_assistant_turn_and_nothing_else(tmp_path, tokenizer):
    renderer = chat_renderer(tokenizer, system_prompt="Be brief.")
    f = write_jsonl(tmp_path / "c.jsonl", [{"messages": CHAT, "id": 7}])
    (ex,), _ = load_sft_examples([f], renderer, eos_id=2, max_tokens=128)
    assert tokenizer.decode(ex.input_ids) == "<system>Be brief.<user>1+1=<assistant>2</s><user>3+3=<assistant>6</s>"
    # The assistant's words and its end-of-turn token; the system prompt, user turns and role markers are masked.
    assert trained_text(tokenizer, ex) == ["2", "</s>", "6", "</s>"]


def test_own_column_names_and_a_chat_prompt_for_a_pair(tmp_path, tokenizer):
    renderer = chat_renderer(tokenizer)
    columns = SFTColumns(prompt_key="q", response_key="a", messages_key="conv", section="sft")
    f = write_jsonl(tmp_path / "o.jsonl", [{"q": "5-1=", "a": "4"}, {"conv": CHAT[:3], "a": "6"},
                                           {"conv": CHAT}])
    pair, chat_prompt, conversation = load_sft_examples([f], renderer, 2, 128, columns)[0]
    assert tokenizer.decode(pair.input_ids) == "<user>5-1=<assistant>4</s>" and trained_text(tokenizer, pair) == ["4",
                                                                                                                "</s>"]
    assert trained_text(tokenizer, chat_prompt) == ["6", "</s>"]  # the chat is the prompt, the response its target
    assert trained_text(tokenizer, conversation) == ["2", "</s>", "6", "</s>"]


def test_bad_rows_name_the_row_and_the_fix(tmp_path, tokenizer):
    plain, chat = PromptRenderer(tokenizer), chat_renderer(tokenizer)
    cases = [
        (plain, [{"prompt": "1"}], r"s.jsonl:1: no column 'response' \(sft.response_key\), no conversation in "
                                   r"'messages' \(sft.messages_key\) and no text in 'text' \(sft.text_key\); this "
                                   "row has columns: prompt"),
        (plain, [{"prompt": "1", "response": " "}], "'response' is empty, so the example would train only an end"),
        (chat, [{"prompt": CHAT[:1], "completion": CHAT[:2]}], "'completion' is a list of messages that starts with "
                                                               "a user message; .* belong in the prompt"),
        (chat, [{"messages": [{"role": "human", "content": "1"}]}], "message 0 has the role 'human'"),
        (chat, [{"messages": {"role": "user", "content": "1"}}], "'messages' holds dict; a conversation is a list"),
        (plain, [{"text": ""}], r"'text' \(sft.text_key\) must be a non-empty text, got an empty text"),
        (plain, [{"messages": CHAT}], "a conversation needs a tokenizer chat template"),
        (chat, [{"messages": CHAT[:1]}], "has no assistant message"),
        (chat, [{"messages": "hello"}], "holds a text; a conversation is a list"),
        (chat_renderer(tokenizer, REWRITING), [{"messages": CHAT}], "Split it into one row per assistant message"),
        (plain, [{"prompt": "1+1=", "response": "2" * 40}], r"over sft.max_tokens=16; raise it, or set sft.overlong"),
    ]
    for renderer, rows, message in cases:
        f = write_jsonl(tmp_path / "s.jsonl", rows)
        with pytest.raises(DataError, match=message):
            load_sft_examples([f], renderer, 2, 16, SFTColumns(section="sft"))
    f = write_jsonl(tmp_path / "s.jsonl", [{"prompt": "1+1=", "response": "2" * 40}, {"prompt": "1", "response": "2"}])
    examples, dropped = load_sft_examples([f], plain, 2, 16, overlong="drop")
    assert dropped == 1 and [e.uid[-1] for e in examples] == ["2"]


def test_every_layout_trains_exactly_the_expected_tokens(tmp_path, tokenizer):
    """TRL's conversational prompt-completion, ShareGPT conversations and a conversation stored as JSON text
    train the same tokens as the conversation in ``messages``: the assistant turns, never the JSON of a list."""
    renderer = chat_renderer(tokenizer)
    sharegpt = [{"from": {"user": "human", "assistant": "gpt"}[m["role"]], "value": m["content"]} for m in CHAT]
    rows = [{"messages": CHAT}, {"prompt": CHAT[:3], "completion": CHAT[3:]}, {"conversations": sharegpt},
            {"messages": json.dumps(CHAT)}]
    f = write_jsonl(tmp_path / "layouts.jsonl", rows)
    reference, *others = load_sft_examples([f], renderer, 2, 128)[0]
    assert trained_text(tokenizer, reference) == ["2", "</s>", "6", "</s>"]
    # The prompt-completion row trains the last reply only; its prompt is the first three messages.
    assert others[0].input_ids == reference.input_ids and trained_text(tokenizer, others[0]) == ["6", "</s>"]
    for example in others[1:]:
        assert (example.input_ids, example.loss_mask) == (reference.input_ids, reference.loss_mask)


def test_text_pairs_in_trl_and_verl_naming_and_plain_text(tmp_path, tokenizer):
    """TRL's prompt-completion text (``completion`` under the default key), verl's nested question and answer
    (dotted keys), a numeric answer, and TRL's language-modeling ``text`` (every token and EOS trained)."""
    plain = PromptRenderer(tokenizer)
    f = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "1+2=", "completion": "3"}, {"text": "1+2=3"}])
    pair, text = load_sft_examples([f], plain, 2, 32)[0]
    assert (pair.input_ids[4:], pair.loss_mask) == ([tokenizer.convert_tokens_to_ids("3"), 2], [0] * 4 + [1, 1])
    assert text.input_ids == tokenizer("1+2=3")["input_ids"] + [2] and text.loss_mask == [1] * len(text.input_ids)
    verl = SFTColumns(prompt_key="extra_info.question", response_key="extra_info.answer", section="sft")
    f = write_jsonl(tmp_path / "v.jsonl", [{"extra_info": {"question": "1+2=", "answer": 3}, "data_source": "x"}])
    (example,), _ = load_sft_examples([f], plain, 2, 32, verl)
    assert (example.input_ids, example.loss_mask) == (pair.input_ids, pair.loss_mask)


def test_packing_is_first_fit_longest_first():
    # lengths 5, 3, 4, 2, 6 into rows of 8: 6 -> row 0, 5 -> row 1, 4 -> row 2, 3 -> row 1, 2 -> row 0
    assert pack_rows([5, 3, 4, 2, 6], 8) == [[4, 3], [0, 1], [2]]
    assert pack_rows([8, 8], 8) == [[0], [1]]


def examples_of(lengths, trained):
    g = torch.Generator().manual_seed(0)
    return [SFTExample(f"e{i}", torch.randint(4, 90, (n,), generator=g).tolist(), [0] * (n - k) + [1] * k)
            for i, (n, k) in enumerate(zip(lengths, trained))]


def test_padded_batches_are_the_warm_ups_collated_pairs():
    examples = examples_of([5, 9, 3], [2, 4, 1])
    batch = sft_batch(examples, pad_id=0)
    expected = collate([e.input_ids[:e.prompt_length] for e in examples],
                       [e.input_ids[e.prompt_length:] for e in examples], pad_id=0)
    for name in ("input_ids", "attention_mask", "response_mask", "advantages", "rollout_logprobs"):
        assert torch.equal(getattr(batch, name), getattr(expected, name)), name
    assert batch.position_ids is None
    assert len(sft_batch(examples, 0, rows_multiple=2)) == 4  # an empty row for a second rank


@pytest.mark.parametrize("levers", [{}, {"remove_padding": "pack", "logprob_chunk_tokens": 4}])
def test_packed_rows_restart_positions_and_give_the_padded_loss_and_gradient(tiny_model_dir, levers):
    """Several examples per row attend only within themselves: loss and gradient equal one example per row
    (also under the trainer's memory levers, which leave rows of packed examples as they are)."""
    from gyre.algos import LossDenominator
    from gyre.engines.forward import ForwardContext
    from gyre.engines.losses import SFTLoss
    from gyre.engines.specs import MemoryLevers
    from gyre.models.loading import load_causal_lm
    from gyre.types import MetricSums

    examples = examples_of([7, 3, 5, 4, 2], [3, 2, 2, 3, 1])
    packed, padded = sft_batch(examples, 0, pack_tokens=10, rows_multiple=2), sft_batch(examples, 0)
    assert len(packed) == 4 and len(padded) == 5  # [7, 3], [5, 4], [2] and an empty row for the second rank
    assert packed.position_ids[0].tolist() == [0, 1, 2, 3, 4, 5, 6, 0, 1, 2]
    assert packed.position_ids[2].tolist()[:3] == [0, 1, 0]  # the padding after an example starts afresh
    assert packed.response_mask.sum() == padded.response_mask.sum() == 11
    model = load_causal_lm(tiny_model_dir)
    fwd = ForwardContext(torch.device("cpu"), levers=MemoryLevers(**levers))
    results = []
    for batch in (packed, padded):
        model.zero_grad()
        loss = SFTLoss(LossDenominator(tokens=11.0)).compute(model, batch, fwd, MetricSums())
        loss.backward()
        results.append((loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss_packed, grads_packed), (loss_padded, grads_padded) = results
    assert loss_packed == pytest.approx(loss_padded, rel=1e-5)
    for name, grad in grads_padded.items():
        assert torch.allclose(grads_packed[name], grad, atol=1e-6, rtol=1e-4), name
