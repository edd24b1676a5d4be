"""The ``data`` section: where prompts come from, which columns hold what, and how prompts become text.

Sources are local files (JSONL, JSON, Parquet, CSV/TSV), directories, globs, or Hugging Face datasets
read offline (``{dataset: ...}`` entries). The column keys map any dataset's names onto gyre's
(prompt, answer, tag); every other column reaches the reward function as a keyword argument.
"""

from __future__ import annotations

import re
import string
from typing import Any, Literal

from pydantic import field_validator, model_validator

from gyre.config.base import PositiveInt, StrictModel


class DatasetSource(StrictModel):
    """A dataset read with the ``datasets`` library, offline: nothing is downloaded."""

    dataset: str
    """A local directory (data files, the files of a dataset repository, or a ``save_to_disk`` output) or
    a Hub id such as ``openai/gsm8k`` already in the local cache: the hub cache (``HF_HUB_CACHE``, filled
    by ``hf download --repo-type dataset ID``) or the datasets cache (``HF_DATASETS_CACHE``, filled by an
    earlier online ``datasets.load_dataset``)."""
    name: str | None = None
    """The dataset's configuration (``load_dataset``'s ``name``), e.g. "main" for openai/gsm8k."""
    split: str = "train"
    """Which split to read, e.g. "train" or "test"."""
    revision: str | None = None
    """A Hub id's revision (branch, tag or commit) in the hub cache; default: the cached "main"."""


DataSource = str | DatasetSource


def template_fields(template: str) -> list[str]:
    """The column names a prompt template reads (``{question}``, ``{choices[0]}`` -> choices); a
    ValueError naming the problem when it is not a usable template."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"data.prompt_template {template!r} is not a format string ({exc}); write literal "
                         "braces doubled: {{ and }}") from None
    fields = []
    for _, field, _, _ in parsed:
        if field is None:
            continue
        root = re.split(r"[.\[]", field, maxsplit=1)[0]
        if not root or root.isdigit():
            raise ValueError(f"data.prompt_template {template!r} has a field {{{field}}} that names no column; "
                             "name a column ({question}), and write literal braces doubled (\\boxed{{}})")
        if "." in field.split("[", 1)[0] or "]." in field:
            raise ValueError(f"data.prompt_template field {{{field}}} reads an attribute; only columns and "
                             "indexes ({choices[0]}) are allowed")
        fields.append(root)
    if not fields:
        raise ValueError(f"data.prompt_template {template!r} reads no column; name one, e.g. {{question}}")
    return fields


class DataConfig(StrictModel):
    """Prompts, their answers and tags, from your own files or datasets (see ``gyre.data``)."""

    train_files: list[DataSource]
    """Where the training prompts are: files (.jsonl, .json, .parquet, .csv, .tsv), directories (their
    data files, not subdirectories), globs ("data/*.parquet", "shards/**/*.jsonl"), and
    ``{dataset: ID_OR_DIR, name: ..., split: train}`` entries read with ``datasets`` offline."""
    val_files: list[DataSource] = []
    """Held-out prompts for validation, in the same forms as train_files."""
    prompt_key: str = "prompt"
    """The column holding the prompt: a text, or a chat (a list of {"role", "content"}, TRL's
    conversational format and verl's). Rows without it may hold a chat in ``messages``. A dotted key
    ("extra.question") reads inside a column that holds an object. Unused with prompt_template."""
    prompt_template: str | None = None
    """Build the prompt from several columns with a Python format string instead: "{question}\\nA. {A}"
    ({choices[0]} indexes a list column; literal braces are doubled: \\boxed{{}}). No code runs."""
    answer_key: str | dict[str, str] | None = "ground_truth"
    """The column holding the answer the reward checks (the reward's ``ground_truth``). Numbers become
    text; an object or list becomes its JSON text (code tests). Dotted keys as for prompt_key, e.g.
    verl's "reward_model.ground_truth". A mapping builds the answer from several columns, as the JSON
    object {field: that column's value}: {inputs: input, outputs: output} for stdin/stdout tests in two
    columns, {test: test, entry_point: entry_point} for HumanEval, {asserts: test_list, setup:
    test_setup_code} for MBPP. null: the rows have no answer (a judge, a reward model, or a function that
    reads other columns); the reward's ground_truth is then ""."""
    answer_pattern: str | None = None
    """A regex with one capturing group: the ground truth is the group of its last match in the answer
    column, e.g. "####\\s*(.+)" for GSM8K's "reasoning... #### 42". A row without a match is an error."""
    answer_boxed: bool = False
    """The ground truth is the content of the last \\boxed{...} in the answer column (MATH's worked
    solutions). A row without one is an error."""
    tag_key: str | None = "tag"
    """The column holding each prompt's tag (routes it to a reward domain); None reads no tags."""
    system_prompt: str | None = None
    """A system message put before every prompt whose chat has none (needs a chat template)."""
    chat_template: Literal["auto", "always", "never"] = "auto"
    """auto: use the tokenizer's chat template when it has one; chat prompts always need one."""
    chat_template_kwargs: dict[str, Any] = {}
    """Extra arguments of the tokenizer's apply_chat_template, e.g. {enable_thinking: false} for Qwen3."""
    max_prompt_tokens: PositiveInt = 512
    """The longest prompt, in tokens (after the chat template); longer ones follow overlong_prompts."""
    overlong_prompts: Literal["error", "drop", "truncate_left"] = "drop"
    """Prompts over max_prompt_tokens: error stops at load time naming them; drop leaves them out;
    truncate_left keeps their last max_prompt_tokens tokens (TRL's truncation side). `gyre check` and
    `gyre train` print how many were dropped or truncated."""
    shuffle: bool = True
    """Walk the training prompts in a new seeded order every epoch."""
    max_val_prompts: PositiveInt | None = None
    """Validate on at most this many held-out prompts (the first ones)."""

    @field_validator("train_files")
    @classmethod
    def _non_empty(cls, value: list[DataSource]) -> list[DataSource]:
        if not value:
            raise ValueError("data.train_files must name at least one file, directory, glob or {dataset: ...}")
        return value

    @field_validator("prompt_template")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        if value is not None:
            template_fields(value)
        return value

    @field_validator("answer_pattern")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            groups = re.compile(value).groups
        except re.error as exc:
            raise ValueError(f"data.answer_pattern {value!r} is not a regular expression: {exc}") from None
        if groups != 1:
            raise ValueError(f"data.answer_pattern {value!r} has {groups} capturing groups; it needs exactly one, "
                             r"around the answer: '####\s*(.+)'")
        return value

    @model_validator(mode="after")
    def _one_extraction(self) -> DataConfig:
        if not isinstance(self.answer_key, str) and (self.answer_pattern is not None or self.answer_boxed):
            raise ValueError("data.answer_pattern / data.answer_boxed read one answer column, and data.answer_key is "
                             f"{'null' if self.answer_key is None else 'a mapping of columns'}: name one column in "
                             "data.answer_key, or remove them")
        if isinstance(self.answer_key, dict) and not self.answer_key:
            raise ValueError("data.answer_key is an empty mapping: give {field: column, ...}, one column, or null")
        if self.answer_pattern is not None and self.answer_boxed:
            raise ValueError("data.answer_pattern and data.answer_boxed both say how to read the answer; set one")
        return self
