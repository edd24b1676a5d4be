"""The data section: source entries in every form, and templates and patterns checked when the config loads."""

import pytest
import yaml
from pydantic import ValidationError

from gyre.config import ConfigError, load_config, validate_config
from gyre.config.data_schema import DataConfig, DatasetSource
from gyre.config.report import resolved_yaml


def test_sources_of_every_form_from_overrides_and_back():
    cfg = load_config(None, ["model.path=m", "data.train_files=[a.jsonl, 'shards/*.parquet', "
                             "{dataset: openai/gsm8k, name: main}]", "data.val_files=[{dataset: d, split: test}]"])
    assert cfg.data.train_files == ["a.jsonl", "shards/*.parquet", DatasetSource(dataset="openai/gsm8k", name="main")]
    assert cfg.data.val_files == [DatasetSource(dataset="d", split="test")]
    assert validate_config(yaml.safe_load(resolved_yaml(cfg))) == cfg
    with pytest.raises(ConfigError, match="spilt"):
        load_config(None, ["model.path=m", "data.train_files=[{dataset: d, spilt: test}]"])


@pytest.mark.parametrize("template,message", [
    ("\\boxed{}", r"has a field \{\} that names no column; .* write literal braces doubled"),
    ("{0}", r"names no column"),
    ("{q.__class__}", r"reads an attribute; only columns and indexes"),
    ("{q[0].real}", r"reads an attribute"),
    ("no fields", r"reads no column"),
    ("{unclosed", r"is not a format string"),
])
def test_bad_templates_are_config_errors(template, message):
    with pytest.raises(ValidationError, match=message):
        DataConfig(train_files=["x"], prompt_template=template)
    assert DataConfig(train_files=["x"], prompt_template="{q} {choices[1]} \\boxed{{}}").prompt_template


def test_answer_extraction_settings():
    with pytest.raises(ValidationError, match="has 0 capturing groups; it needs exactly one"):
        DataConfig(train_files=["x"], answer_pattern="####")
    with pytest.raises(ValidationError, match="is not a regular expression"):
        DataConfig(train_files=["x"], answer_pattern="(")
    with pytest.raises(ValidationError, match="set one"):
        DataConfig(train_files=["x"], answer_pattern="(.)", answer_boxed=True)
    with pytest.raises(ValidationError, match="must name at least one file, directory, glob"):
        DataConfig(train_files=[])
