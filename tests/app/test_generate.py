"""gyre generate: responses to a prompt file (no answers needed) as JSONL, seeded and with id columns."""

import json

import pytest

from gyre.app.command_config import command_config
from gyre.app.evaluate import OutputExistsError
from gyre.app.generate import GenerateOptions, generate_responses
from gyre.app.model_source import resolve_source
from gyre.data.prompts import DataError

QUIET = lambda s: None  # noqa: E731


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.csv"
    path.write_text("text,item_id,topic\n1+2=,a,sum\n7-3=,b,diff\n")
    return path


def config(source, prompts, *overrides, temperature=1.0):
    flags = {"data.train_files": [str(prompts)], "rollout.sampling.temperature": temperature,
             "rollout.sampling.max_new_tokens": 5, "rollout.max_batch_size": 3}
    return command_config(source, None, ["data.prompt_key=text", *overrides], flags, needs="data.train_files")


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_responses_with_id_columns_the_same_every_time(tiny_model_dir, prompts, tmp_path):
    source = resolve_source(str(tiny_model_dir))
    cfg = config(source, prompts)
    first = read(generate_responses(cfg, source, GenerateOptions(tmp_path / "a.jsonl", n=3), echo=QUIET))
    assert [(r["item_id"], r["prompt"], r["sample"]) for r in first] == \
        [("a", "1+2=", 0), ("a", "1+2=", 1), ("a", "1+2=", 2), ("b", "7-3=", 0), ("b", "7-3=", 1), ("b", "7-3=", 2)]
    assert "topic" not in first[0] and first[0]["source"].endswith("prompts.csv:2")
    assert len({r["response"] for r in first}) > 1  # sampled at temperature 1
    again = read(generate_responses(cfg, source, GenerateOptions(tmp_path / "b.jsonl", n=3), echo=QUIET))
    assert again == first  # one seeded stream per prompt
    greedy = generate_responses(config(source, prompts, temperature=0.0), source,
                                GenerateOptions(tmp_path / "g.jsonl", keep=("all",)), echo=QUIET)
    rows = read(greedy)
    assert [r["topic"] for r in rows] == ["sum", "diff"] and "sample" not in rows[0]  # one response per prompt
    twice = read(generate_responses(config(source, prompts, temperature=0.0), source,
                                    GenerateOptions(tmp_path / "g2.jsonl", n=2), echo=QUIET))
    assert [r["response"] for r in twice] == [rows[0]["response"]] * 2 + [rows[1]["response"]] * 2  # greedy


def test_generate_refuses_to_overwrite_and_names_missing_columns(tiny_model_dir, prompts, tmp_path):
    source = resolve_source(str(tiny_model_dir))
    out = tmp_path / "out.jsonl"
    out.write_text("mine\n")
    with pytest.raises(OutputExistsError, match="out.jsonl already exist.*--overwrite"):
        generate_responses(config(source, prompts), source, GenerateOptions(out), echo=QUIET)
    assert out.read_text() == "mine\n"
    with pytest.raises(DataError, match="prompts.csv:2: no column 'row' \\(--keep\\); this row's other columns: "
                                        "item_id, topic"):
        generate_responses(config(source, prompts), source, GenerateOptions(out, keep=("row",), overwrite=True),
                           echo=QUIET)
    with pytest.raises(DataError, match="no column 'question' \\(data.prompt_key\\)"):
        generate_responses(config(source, prompts, "data.prompt_key=question"), source,
                           GenerateOptions(out, overwrite=True), echo=QUIET)


def test_zero_samples_per_prompt_is_refused(tiny_model_dir, prompts, tmp_path, capsys):
    from gyre.app.cli import main

    out = tmp_path / "out.jsonl"
    assert main(["generate", str(tiny_model_dir), "--data", str(prompts), "--n", "0", "--out", str(out),
                 "data.prompt_key=text"]) == 2
    assert "--n 0: samples per prompt must be at least 1" in capsys.readouterr().err and not out.exists()
