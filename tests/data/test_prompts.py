import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gyre.data.columns import ColumnMap
from gyre.data.prompts import DataError, OverlongCount, PromptRenderer, load_prompts
from gyre.models.loading import load_tokenizer

# A minimal chat template that shows every message and the template's extra argument.
TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
            "{% if add_generation_prompt %}<a{{ '-nothink' if enable_thinking is false else '' }}>{% endif %}")


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    return PromptRenderer(load_tokenizer(tiny_model_dir))


@pytest.fixture
def chat_tok(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    tok.chat_template = TEMPLATE
    return tok


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_jsonl_prompts_are_tokenised(tmp_path, renderer):
    f = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "1+2=", "ground_truth": 3, "tag": "math", "extra": 1},
                                           {"prompt": "4+4=", "ground_truth": "8"}])
    records, overlong = load_prompts([f], renderer, 64)
    assert overlong == OverlongCount(0, 0)
    assert [r.ground_truth for r in records] == ["3", "8"]
    assert records[0].tag == "math" and records[1].tag is None
    assert records[0].uid.endswith("a.jsonl:1")
    assert renderer.tokenizer.decode(records[0].prompt_ids) == "1+2="
    # Every other column is kept for the reward function, the answer column as written too.
    assert records[0].columns == {"ground_truth": 3, "extra": 1} and records[1].columns == {"ground_truth": "8"}


def test_parquet_prompts(tmp_path, renderer):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"prompt": ["7-2=", "9-9="], "ground_truth": ["5", "0"]}), path)
    records, _ = load_prompts([str(path)], renderer, 64)
    assert [r.prompt_text for r in records] == ["7-2=", "9-9="]
    assert records[1].uid.endswith("p.parquet:row 1")


def test_own_column_names(tmp_path, renderer):
    path = tmp_path / "mine.parquet"
    pq.write_table(pa.table({"q": ["2*3="], "solution": ["6"], "source": ["arith"], "level": [2]}), path)
    columns = ColumnMap(prompt_key="q", answer_key="solution", tag_key="source")
    (record,), _ = load_prompts([str(path)], renderer, 64, columns)
    assert (record.prompt_text, record.ground_truth, record.tag, record.question) == ("2*3=", "6", "arith", "2*3=")
    assert record.columns == {"solution": "6", "level": 2}


@pytest.mark.parametrize("row,message", [
    ('{"prompt": "1+1="', r"bad.jsonl:2: invalid JSON"),
    ({"question": "x", "ground_truth": "1"}, r"bad.jsonl:2: no column 'prompt' \(data.prompt_key\); this row has "
                                              r"columns: ground_truth, question. Set data.prompt_key"),
    ({"prompt": "1+1="}, r"bad.jsonl:2: no column 'ground_truth' \(data.answer_key\); this row has columns: prompt"),
    ({"prompt": "1+1=", "ground_truth": True}, r"bad.jsonl:2: 'ground_truth' must be a text, a number"),
    ({"prompt": "", "ground_truth": "1"}, r"bad.jsonl:2: 'prompt' must be a non-empty text or a chat"),
    ({"prompt": "1+1=", "ground_truth": "2", "tag": 5}, r"bad.jsonl:2: 'tag' must be a string"),
    ([1, 2], r"bad.jsonl:2: expected a JSON object"),
    ({"messages": [{"role": "user", "content": "hi"}], "ground_truth": "1"}, r"bad.jsonl:2: chat prompts need"),
    ({"messages": [{"role": "user"}], "ground_truth": "1"}, r"bad.jsonl:2: 'messages' message 0 must be \{'role': str, "
                                                           r"'content': str\}, got \{'role': 'user'\}"),
    ({"messages": [{"role": "robot", "content": "hi"}], "ground_truth": "1"},
     r"bad.jsonl:2: 'messages' message 0 has the role 'robot'; chat templates know the roles system, developer, user"),
    ({"messages": {"role": "user", "content": "hi"}, "ground_truth": "1"},
     r"bad.jsonl:2: 'messages' must be a non-empty text or a chat: .* \(got dict\)"),
])
def test_malformed_rows_name_file_and_line(tmp_path, renderer, row, message):
    f = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "ok", "ground_truth": "1"}, row])
    with pytest.raises(DataError, match=message):
        load_prompts([f], renderer, 64)


def test_overlong_prompts_follow_the_policy(tmp_path, renderer):
    rows = [{"prompt": "abcdefghijklmnop", "ground_truth": "1"}, {"prompt": "1=", "ground_truth": "1"}]
    f = write_jsonl(tmp_path / "a.jsonl", rows)
    records, overlong = load_prompts([f], renderer, 10)
    assert len(records) == 1 and overlong == OverlongCount(dropped=1)
    assert overlong.describe(10) == " (1 dropped: longer than data.max_prompt_tokens=10)"

    records, overlong = load_prompts([f], renderer, 10, overlong="truncate_left")
    assert overlong == OverlongCount(truncated=1) and len(records) == 2
    # One id per character: 16 ids, of which the last 10 are kept (the prompt's tail).
    assert len(records[0].prompt_ids) == 10 and records[0].prompt_text == "ghijklmnop"
    assert records[0].question == "abcdefghijklmnop"  # rewards still read the whole question
    assert "1 truncated to their last 10 tokens" in overlong.describe(10)
    assert OverlongCount().describe(10) == " (none longer than data.max_prompt_tokens=10)"  # zero is said too

    with pytest.raises(DataError, match=r"1 prompt\(s\) longer than data.max_prompt_tokens=10, e.g. .*a.jsonl:1 "
                                        r"\(16 tokens\); raise data.max_prompt_tokens, or set data.overlong_prompts"):
        load_prompts([f], renderer, 10, overlong="error")
    with pytest.raises(DataError, match="no usable prompts .* all 1 are longer"):
        load_prompts([write_jsonl(tmp_path / "b.jsonl", rows[:1])], renderer, 10)


def test_chat_template_is_applied(tmp_path, chat_tok):
    r = PromptRenderer(chat_tok, "auto")
    f = write_jsonl(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": "2+2="}], "ground_truth": "4"},
                                          {"prompt": "3+3=", "ground_truth": "6"},
                                          {"prompt": [{"role": "user", "content": "5+5="}], "ground_truth": "10"}])
    records, _ = load_prompts([f], r, 64)
    assert [rec.prompt_text for rec in records] == ["<user>2+2=<a>", "<user>3+3=<a>", "<user>5+5=<a>"]
    # Rewards (judges above all) read the question as written, not the templated text.
    assert [rec.question for rec in records] == ["2+2=", "3+3=", "5+5="]
    assert PromptRenderer(chat_tok, "never").use_template is False


def test_system_prompt_and_template_kwargs(tmp_path, chat_tok, renderer):
    r = PromptRenderer(chat_tok, "auto", system_prompt="Be brief.", template_kwargs={"enable_thinking": False})
    f = write_jsonl(tmp_path / "c.jsonl", [
        {"prompt": "1+1=", "ground_truth": "2"},
        {"prompt": [{"role": "system", "content": "Own."}, {"role": "user", "content": "2+2="}], "ground_truth": "4"}])
    records, _ = load_prompts([f], r, 64)
    # The system prompt goes before chats without one; a chat's own system message is kept.
    assert [rec.prompt_text for rec in records] == ["<system>Be brief.<user>1+1=<a-nothink>",
                                                    "<system>Own.<user>2+2=<a-nothink>"]
    for key, kwargs in (("system_prompt", {"system_prompt": "x"}),
                        ("chat_template_kwargs", {"template_kwargs": {"enable_thinking": False}})):
        with pytest.raises(DataError, match=f"data.{key} needs a chat template"):
            PromptRenderer(renderer.tokenizer, "auto", **kwargs)
