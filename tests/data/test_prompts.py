import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gyre.data.prompts import DataError, PromptRenderer, load_prompts, load_sft_examples
from gyre.models.loading import load_tokenizer


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    return PromptRenderer(load_tokenizer(tiny_model_dir))


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_jsonl_prompts_are_tokenised(tmp_path, renderer):
    f = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "1+2=", "ground_truth": 3, "tag": "math", "extra": 1},
                                           {"prompt": "4+4=", "ground_truth": "8"}])
    records, dropped = load_prompts([f], renderer, 64)
    assert dropped == 0
    assert [r.ground_truth for r in records] == ["3", "8"]
    assert records[0].tag == "math" and records[1].tag is None
    assert records[0].uid.endswith("a.jsonl:1")
    assert renderer.tokenizer.decode(records[0].prompt_ids) == "1+2="


def test_parquet_prompts(tmp_path, renderer):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"prompt": ["7-2=", "9-9="], "ground_truth": ["5", "0"]}), path)
    records, _ = load_prompts([str(path)], renderer, 64)
    assert [r.prompt_text for r in records] == ["7-2=", "9-9="]
    assert records[1].uid.endswith("p.parquet:row 1")


@pytest.mark.parametrize("row,message", [
    ('{"prompt": "1+1="', r"bad.jsonl:2: invalid JSON"),
    ({"question": "x", "ground_truth": "1"}, r"bad.jsonl:2: row needs a non-empty 'prompt'"),
    ({"prompt": "1+1="}, r"bad.jsonl:2: missing 'ground_truth'"),
    ({"prompt": "1+1=", "ground_truth": [1]}, r"bad.jsonl:2: 'ground_truth' must be a string or number"),
    ({"prompt": "1+1=", "ground_truth": "2", "tag": 5}, r"bad.jsonl:2: 'tag' must be a string"),
    ([1, 2], r"bad.jsonl:2: expected a JSON object"),
    ({"messages": [{"role": "user", "content": "hi"}], "ground_truth": "1"}, r"bad.jsonl:2: chat 'messages' need"),
])
def test_malformed_rows_name_file_and_line(tmp_path, renderer, row, message):
    f = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "ok", "ground_truth": "1"}, row])
    with pytest.raises(DataError, match=message):
        load_prompts([f], renderer, 64)


def test_missing_file_and_wrong_format(tmp_path, renderer):
    with pytest.raises(DataError, match="does not exist"):
        load_prompts([str(tmp_path / "nope.jsonl")], renderer, 64)
    (tmp_path / "a.csv").write_text("x")
    with pytest.raises(DataError, match="unsupported format"):
        load_prompts([str(tmp_path / "a.csv")], renderer, 64)


def test_long_prompts_are_dropped_and_counted(tmp_path, renderer):
    rows = [{"prompt": "x" * 50, "ground_truth": "1"}, {"prompt": "1=", "ground_truth": "1"}]
    f = write_jsonl(tmp_path / "a.jsonl", rows)
    records, dropped = load_prompts([f], renderer, 10)
    assert len(records) == 1 and dropped == 1
    with pytest.raises(DataError, match="no usable prompts"):
        load_prompts([write_jsonl(tmp_path / "b.jsonl", [{"prompt": "x" * 50, "ground_truth": "1"}])], renderer, 10)


def test_chat_template_is_applied(tmp_path, tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    tok.chat_template = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                         "{% if add_generation_prompt %}<a>{% endif %}")
    r = PromptRenderer(tok, "auto")
    f = write_jsonl(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": "2+2="}], "ground_truth": "4"},
                                          {"prompt": "3+3=", "ground_truth": "6"}])
    records, _ = load_prompts([f], r, 64)
    assert records[0].prompt_text == "<user>2+2=<a>"
    assert records[1].prompt_text == "<user>3+3=<a>"
    # Rewards (judges above all) read the question as written, not the templated text.
    assert [rec.question for rec in records] == ["2+2=", "3+3="]
    assert PromptRenderer(tok, "never").render.__self__.use_template is False


def test_sft_examples_end_with_eos(tmp_path, renderer):
    f = write_jsonl(tmp_path / "s.jsonl", [{"prompt": "1+2=", "response": "3"}])
    (ex,) = load_sft_examples([f], renderer, eos_id=2, max_tokens=32)
    assert ex.response_ids[-1] == 2 and renderer.tokenizer.decode(ex.response_ids[:-1]) == "3"
    with pytest.raises(DataError, match="missing 'response'"):
        load_sft_examples([write_jsonl(tmp_path / "t.jsonl", [{"prompt": "1"}])], renderer, 2, 32)
