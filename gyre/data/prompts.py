"""Prompt datasets from local JSONL or Parquet files, validated row by row.

A row holds ``prompt`` (text) or ``messages`` (a chat: [{"role", "content"}]), a ``ground_truth`` for RL
rows or a ``response`` for SFT rows, and an optional ``tag``. Other columns are ignored. A malformed
row is an error that names its file and line, raised while loading, before any training starts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gyre.types import PromptRecord


class DataError(ValueError):
    """A dataset file or row is unusable; the message names the file and line (or row)."""


@dataclass
class RawRow:
    where: str
    """"file:line" for JSONL (1-based lines), "file:row N" for Parquet (0-based rows)."""
    data: dict[str, Any]


def read_rows(path: str | Path) -> Iterator[RawRow]:
    """Rows of a ``.jsonl``/``.json`` (one object per line) or ``.parquet`` file."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"data file {path} does not exist")
    if p.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(p)
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"data file {path} is not a readable Parquet file: {exc}") from None
        for i, row in enumerate(table.to_pylist()):
            yield RawRow(f"{p}:row {i}", row)
        return
    if p.suffix not in (".jsonl", ".json"):
        raise DataError(f"data file {path}: unsupported format {p.suffix!r}; use .jsonl or .parquet")
    with p.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            line = _decode(raw, p, lineno)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{p}:{lineno}: invalid JSON ({exc.msg}); each line must be one JSON object") from None
            if not isinstance(row, dict):
                raise DataError(f"{p}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield RawRow(f"{p}:{lineno}", row)


def _decode(raw: bytes, path: Path, lineno: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
                        "save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None


class PromptRenderer:
    """Turns a row's ``prompt`` or ``messages`` into the exact text and token ids the model sees."""

    def __init__(self, tokenizer, chat_template: str = "auto"):
        self.tokenizer = tokenizer
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if chat_template == "always" and not has_template:
            raise DataError('data.chat_template is "always" but the tokenizer has no chat template')
        self.use_template = has_template and chat_template != "never"

    def render(self, row: RawRow) -> str:
        data = row.data
        if "messages" in data:
            messages = data["messages"]
            if not isinstance(messages, list) or not all(
                    isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                    for m in messages) or not messages:
                raise DataError(f"{row.where}: 'messages' must be a non-empty list of {{'role': str, 'content': str}}")
            if not self.use_template:
                raise DataError(f"{row.where}: chat 'messages' need a tokenizer chat template; this one has none "
                                "(or data.chat_template is 'never'): use a 'prompt' text field instead")
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt = data.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise DataError(f"{row.where}: row needs a non-empty 'prompt' string or a 'messages' list "
                            f"(found keys: {sorted(data)})")
        if self.use_template:
            return self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                      add_generation_prompt=True)
        return prompt

    def encode(self, text: str) -> list[int]:
        # A chat template already writes any BOS token into the text.
        return list(self.tokenizer(text, add_special_tokens=not self.use_template)["input_ids"])


def _question(row: RawRow) -> str:
    """What was asked, without the chat template: the prompt text, or the last user message."""
    if "messages" in row.data:
        users = [m["content"] for m in row.data["messages"] if m.get("role") == "user"]
        return users[-1] if users else row.data["messages"][-1]["content"]
    return row.data["prompt"]


def _text_field(row: RawRow, key: str) -> str:
    value = row.data.get(key)
    if value is None:
        raise DataError(f"{row.where}: missing '{key}'")
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise DataError(f"{row.where}: '{key}' must be a string or number, got {type(value).__name__}")
    return str(value)


def _tag(row: RawRow) -> str | None:
    tag = row.data.get("tag")
    if tag is not None and not isinstance(tag, str):
        raise DataError(f"{row.where}: 'tag' must be a string, got {type(tag).__name__}")
    return tag


def load_prompts(files: list[str], renderer: PromptRenderer, max_prompt_tokens: int) -> tuple[list[PromptRecord], int]:
    """RL prompt records from ``files``; returns (records, how many were dropped as too long)."""
    records, dropped = [], 0
    for path in files:
        for row in read_rows(path):
            text = renderer.render(row)
            truth = _text_field(row, "ground_truth")
            ids = renderer.encode(text)
            if len(ids) > max_prompt_tokens:
                dropped += 1
                continue
            records.append(PromptRecord(uid=row.where, prompt_text=text, prompt_ids=ids, ground_truth=truth,
                                        tag=_tag(row), question=_question(row)))
    if not records:
        raise DataError(f"no usable prompts in {files}" + (f" ({dropped} longer than data.max_prompt_tokens="
                                                           f"{max_prompt_tokens}: raise it)" if dropped else
                                                           ": the files hold no rows"))
    return records, dropped


@dataclass
class SFTExample:
    uid: str
    prompt_ids: list[int]
    response_ids: list[int]


def load_sft_examples(files: list[str], renderer: PromptRenderer, eos_id: int, max_tokens: int) -> list[SFTExample]:
    """(prompt, response) pairs; the response is followed by EOS so the model learns to stop."""
    examples = []
    for path in files:
        for row in read_rows(path):
            prompt_ids = renderer.encode(renderer.render(row))
            response = _text_field(row, "response")
            response_ids = list(renderer.tokenizer(response, add_special_tokens=False)["input_ids"]) + [eos_id]
            if len(prompt_ids) + len(response_ids) > max_tokens:
                raise DataError(f"{row.where}: prompt + response is {len(prompt_ids) + len(response_ids)} tokens, "
                                f"over sft_warmup.max_tokens={max_tokens}")
            examples.append(SFTExample(row.where, prompt_ids, response_ids))
    if not examples:
        raise DataError(f"no SFT examples in {files}")
    return examples
