"""Preference pairs in TRL's formats (explicit or implicit prompt, texts or conversations), over-long pairs,
bad rows named with their fix, and batches that keep each pair's two rows together."""

import pytest
import torch

from gyre.data.preference import (
    PreferenceColumns,
    PreferencePair,
    load_preference_pairs,
    preference_batch,
    read_pair,
)
from gyre.data.prompts import DataError, PromptRenderer
from gyre.data.sources import RawRow
from gyre.models.loading import load_tokenizer
from tests.data.test_sft import TEMPLATE, chat_renderer, examples_of, trained_text, write_jsonl

USER = [{"role": "user", "content": "1+1="}]
TWO, THREE = [{"role": "assistant", "content": "2"}], [{"role": "assistant", "content": "3"}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def load(tmp_path, rows, renderer, max_tokens=64, columns=None, overlong="error"):
    return load_preference_pairs([write_jsonl(tmp_path / "p.jsonl", rows)], renderer, 2, max_tokens,
                                 columns or PreferenceColumns(), overlong)


def texts(tokenizer, pair: PreferencePair):
    return [(tokenizer.decode(e.input_ids), "".join(trained_text(tokenizer, e))) for e in (pair.chosen, pair.rejected)]


def test_standard_rows_train_each_completion_and_eos(tmp_path, tokenizer):
    (pair,), count = load(tmp_path, [{"prompt": "1+2=", "chosen": "3", "rejected": "4", "id": 1}],
                          PromptRenderer(tokenizer))
    assert count.dropped == count.truncated == 0 and pair.uid.endswith("p.jsonl:1")
    assert texts(tokenizer, pair) == [("1+2=3</s>", "3</s>"), ("1+2=4</s>", "4</s>")]
    assert pair.chosen.input_ids[:4] == pair.rejected.input_ids[:4] and pair.chosen.loss_mask == [0] * 4 + [1, 1]


def test_conversational_explicit_and_implicit_rows_are_the_same_pair(tmp_path, tokenizer):
    renderer = chat_renderer(tokenizer, system_prompt="Be brief.")
    explicit, implicit = load(tmp_path, [{"prompt": USER, "chosen": TWO, "rejected": THREE},
                                         {"chosen": USER + TWO, "rejected": USER + THREE}], renderer)[0]
    expected = [("<system>Be brief.<user>1+1=<assistant>2</s>", "2</s>"),
                ("<system>Be brief.<user>1+1=<assistant>3</s>", "3</s>")]
    assert texts(tokenizer, explicit) == texts(tokenizer, implicit) == expected


def test_a_text_prompt_with_message_completions_and_own_column_names(tmp_path, tokenizer):
    columns = PreferenceColumns("question", "good", "bad")
    (pair,), _ = load(tmp_path, [{"question": "1+1=", "good": TWO, "bad": "3"}], chat_renderer(tokenizer),
                      columns=columns)
    # A text prompt goes through the chat template as gyre sft renders it; a text completion gets EOS.
    assert texts(tokenizer, pair) == [("<user>1+1=<assistant>2</s>", "2</s>"), ("<user>1+1=<assistant>3</s>", "3</s>")]


def test_implicit_text_prompts_end_before_the_space_where_completions_part():
    row = RawRow("f:1", {"chosen": "Human: hi Assistant: hello there", "rejected": "Human: hi Assistant: go"})
    assert read_pair(row, PreferenceColumns()) == ("Human: hi Assistant:", " hello there", " go")


def test_bad_rows_name_the_row_and_the_fix(tmp_path, tokenizer):
    plain, chat = PromptRenderer(tokenizer), chat_renderer(tokenizer)
    cases = [
        (plain, {"prompt": "1", "rejected": "2"}, r"p.jsonl:1: no column 'chosen' \(dpo.chosen_key\); this row has "
                                                  r"columns: prompt, rejected. Set dpo.chosen_key to the column that "
                                                  "holds the chosen completions"),
        (plain, {"prompt": "1", "chosen": 2, "rejected": "3"}, "'chosen' must be a non-empty text or a chat"),
        (chat, {"chosen": USER + TWO, "rejected": [{"role": "user", "content": "2+2="}] + THREE},
         "do not share a prompt followed by two different completions .* put the prompt in its own column"),
        (chat, {"chosen": USER + TWO, "rejected": USER + TWO}, "'chosen' and 'rejected' are the same completion"),
        (plain, {"prompt": "1+1=", "chosen": "2", "rejected": "2"}, "same completion; a pair that prefers a completion "
                                                                    "to itself teaches nothing"),
        (chat, {"chosen": USER + TWO, "rejected": "1+1=3"}, "must both be conversations or both texts"),
        (plain, {"prompt": USER, "chosen": TWO, "rejected": THREE}, "chat prompts need a tokenizer chat template"),
        (plain, {"prompt": "1+1=", "chosen": TWO, "rejected": THREE}, "completion given as messages needs a tokenizer"),
        (plain, {"prompt": "1+1=", "chosen": "2" * 40, "rejected": "3"},
         r"p.jsonl:1: the pair is 45 tokens \(chosen\) and 6 \(rejected\), over dpo.max_tokens=16; raise it, or set "
         "dpo.overlong to drop or truncate"),
    ]
    for renderer, row, message in cases:
        with pytest.raises(DataError, match=message):
            load(tmp_path, [row], renderer, max_tokens=16)


def test_overlong_pairs_are_dropped_or_truncated(tmp_path, tokenizer):
    rows = [{"prompt": "1+1=", "chosen": "2" * 20, "rejected": "3"}, {"prompt": "1" * 30, "chosen": "2",
                                                                        "rejected": "3"},
            {"prompt": "1+1=", "chosen": "2", "rejected": "3"}]
    plain = PromptRenderer(tokenizer)
    kept, count = load(tmp_path, rows, plain, max_tokens=16, overlong="drop")
    assert [p.uid[-1] for p in kept] == ["3"] and (count.dropped, count.truncated) == (2, 0)
    kept, count = load(tmp_path, rows, plain, max_tokens=16, overlong="truncate")
    # The long completion is cut to the first 16 tokens (4 of prompt, 12 trained); the pair whose prompt
    # alone is 30 tokens has nothing left to compare and is dropped.
    assert [p.uid[-1] for p in kept] == ["1", "3"] and (count.dropped, count.truncated) == (1, 1)
    assert len(kept[0].chosen.input_ids) == 16 and sum(kept[0].chosen.loss_mask) == 12
    assert kept[0].rejected.input_ids == kept[0].rejected.input_ids[:6]
    assert count.describe(16) == "; 1 dropped, 1 truncated (longer than dpo.max_tokens=16)"
    with pytest.raises(DataError, match="no preference pairs left: all 3 are longer than dpo.max_tokens=2"):
        load(tmp_path, rows, plain, max_tokens=2, overlong="drop")


def test_batches_keep_each_pair_on_adjacent_rows():
    examples = examples_of([5, 9, 3, 4, 6, 2], [2, 4, 1, 2, 3, 1])
    pairs = [PreferencePair(f"p{i}", examples[2 * i], examples[2 * i + 1], -1.0 - i, -2.0 - i) for i in range(3)]
    batch = preference_batch(pairs, pad_id=0)
    assert len(batch) == 3 and len(batch.rows) == 6
    assert batch.rows.input_ids[3, :9].tolist() == examples[3].input_ids + [0] * 5  # pair 1's rejected row
    assert batch.ref_chosen.tolist() == [-1.0, -2.0, -3.0] and batch.ref_rejected.tolist() == [-2.0, -3.0, -4.0]
    micro = batch.micro_batches(2)
    assert [len(m) for m in micro] == [2, 1] and micro[1].ref_chosen.tolist() == [-3.0]
    # The last pair's rows are 6 and 2 tokens: trimmed to 6 columns.
    assert micro[1].rows.input_ids.shape == (2, 6) and torch.equal(micro[1].rows.input_ids[1, :2],
                                                                     torch.tensor(examples[5].input_ids))
    assert [len(s) for s in preference_batch(pairs[:2], 0).split(2)] == [1, 1]
    with pytest.raises(ValueError, match="3 pairs do not split into 2 equal shares"):
        batch.split(2)
    with pytest.raises(ValueError, match="reference log-probs were not computed"):
        preference_batch([PreferencePair("p", examples[0], examples[1])], 0)
    assert preference_batch([PreferencePair("p", examples[0], examples[1])], 0, with_reference=False).ref_chosen is None


def test_template_keeps_system_prompt_and_kwargs(tmp_path, tokenizer):
    template = "{% if flag %}[on]{% endif %}" + TEMPLATE
    renderer = chat_renderer(tokenizer, template, template_kwargs={"flag": True})
    (pair,), _ = load(tmp_path, [{"prompt": USER, "chosen": TWO, "rejected": THREE}], renderer)
    assert texts(tokenizer, pair)[0] == ("[on]<user>1+1=<assistant>2</s>", "2</s>")
