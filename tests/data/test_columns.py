"""Column mapping: any dataset's names onto prompt / answer / tag, and the rest kept for the reward."""

import datetime

import pytest

from gyre.config.data_schema import DataConfig
from gyre.data.columns import ColumnMap, jsonable
from gyre.data.sources import DataError, RawRow


def row(**data):
    return RawRow("f.jsonl:3", data)


def cols(**data_keys):
    return ColumnMap.from_config(DataConfig(train_files=["x"], **data_keys))


def test_default_names_and_the_rest():
    r = row(prompt="1+1=", ground_truth=2, tag="math", level=3, meta={"src": "a"})
    c = ColumnMap()
    assert (c.prompt(r), c.answer(r), c.tag(r)) == ("1+1=", "2", "math")
    assert c.others(r) == {"ground_truth": 2, "level": 3, "meta": {"src": "a"}}


def test_own_keys_and_dotted_keys():
    # verl's layout: a chat in "prompt", the answer inside "reward_model", the domain in "data_source".
    chat = [{"role": "user", "content": "2+2?"}]
    r = row(prompt=chat, reward_model={"style": "rule", "ground_truth": "4"}, data_source="gsm8k", extra_info={"i": 7})
    c = cols(answer_key="reward_model.ground_truth", tag_key="data_source")
    assert (c.prompt(r), c.answer(r), c.tag(r)) == (chat, "4", "gsm8k")
    # The parent of a dotted key is still passed: it may hold more than the answer.
    assert c.others(r) == {"reward_model": {"style": "rule", "ground_truth": "4"}, "extra_info": {"i": 7}}
    # tag_key None reads no tag; the "tag" column is then just another column.
    c = cols(tag_key=None)
    assert c.tag(row(prompt="x", ground_truth="1", tag="t")) is None
    assert c.others(row(prompt="x", ground_truth="1", tag="t")) == {"ground_truth": "1", "tag": "t"}


def test_rows_without_an_answer_column():
    """answer_key: null reads no answer (ground truth ""); the error for a missing answer column says so."""
    c = cols(answer_key=None)
    r = row(prompt="Write a haiku.", topic="autumn")
    assert (c.answer(r), c.others(r)) == ("", {"topic": "autumn"})
    with pytest.raises(DataError, match=r"no column 'ground_truth' \(data.answer_key\).*set data.answer_key to null"):
        cols().answer(r)
    with pytest.raises(ValueError, match="data.answer_key is null"):
        cols(answer_key=None, answer_boxed=True)


def test_an_answer_assembled_from_several_columns():
    """answer_key as a mapping: the answer is the JSON object {field: column} (code tests in two columns,
    HumanEval's test and entry point); a missing column names the field it was for."""
    import json

    c = cols(answer_key={"inputs": "stdin", "outputs": "expected"})
    r = row(prompt="Add two numbers.", stdin=["1 2\n"], expected=["3\n"])
    assert json.loads(c.answer(r)) == {"inputs": ["1 2\n"], "outputs": ["3\n"]}
    with pytest.raises(DataError, match=r"no column 'expected' \(data.answer_key\).*the answer's 'outputs'"):
        c.answer(row(prompt="x", stdin=["1"]))
    with pytest.raises(ValueError, match="a mapping of columns"):
        cols(answer_key={"a": "b"}, answer_boxed=True)


def test_messages_column_is_the_fallback_prompt():
    chat = [{"role": "user", "content": "hi", "name": "dropped"}]
    r = row(messages=chat, ground_truth="1")
    assert ColumnMap().prompt(r) == [{"role": "user", "content": "hi"}]
    assert ColumnMap().others(r) == {"ground_truth": "1"}


def test_prompt_template():
    c = cols(prompt_template="{question}\nA. {choices[0]}\nB. {choices[1]}\nAnswer with \\boxed{{}}.",
             answer_key="answer")
    r = row(question="Sky?", choices=["blue", "green"], answer="A", subject=None)
    assert c.prompt(r) == "Sky?\nA. blue\nB. green\nAnswer with \\boxed{}."
    # Template columns still reach the reward, and the answer column as written.
    assert c.others(r) == {"question": "Sky?", "choices": ["blue", "green"], "answer": "A", "subject": None}
    with pytest.raises(DataError, match=r"f.jsonl:3: no column 'question' \(data.prompt_template\); this row has "
                                        r"columns: answer, q. Name only existing columns in data.prompt_template"):
        c.prompt(row(q="x", answer="A"))
    with pytest.raises(DataError, match=r"cannot be filled from this row: IndexError"):
        c.prompt(row(question="x", choices=["one"], answer="A"))


def test_answer_extraction():
    gsm = cols(answer_key="answer", answer_pattern=r"####\s*(.+)")
    assert gsm.answer(row(answer="She has 3 + 4 = 7 apples.\n#### 1,007")) == "1,007"
    boxed = cols(answer_key="solution", answer_boxed=True)
    assert boxed.answer(row(solution="So \\boxed{1} then \\boxed{\\frac{1}{2}}.")) == "\\frac{1}{2}"
    with pytest.raises(DataError, match=r"f.jsonl:3: 'solution' has no complete \\boxed"):
        boxed.answer(row(solution="no box"))
    with pytest.raises(DataError, match=r"data.answer_pattern .* does not match 'answer'"):
        gsm.answer(row(answer="7"))


def test_object_answers_become_json_and_missing_columns_name_the_key():
    tests = {"asserts": ["assert f(1) == 2"]}
    assert cols(answer_key="tests").answer(row(tests=tests)) == '{"asserts": ["assert f(1) == 2"]}'
    with pytest.raises(DataError, match=r"no column 'ground_truth' \(data.answer_key\); this row has columns: "
                                        r"answer, question. Set data.answer_key to the column that holds the answers"):
        ColumnMap().answer(row(question="q", answer="a"))
    with pytest.raises(DataError, match=r"no column 'solution' \(data.answer_key\)"):
        cols(answer_key="solution").answer(row(solution=None))


def test_jsonable():
    assert jsonable((1, 2)) == [1, 2]
    assert jsonable({"d": datetime.date(2024, 1, 2), "b": b"x"}) == {"d": "2024-01-02", "b": "b'x'"}
