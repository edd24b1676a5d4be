"""Which columns of a row hold the prompt, the answer and the tag, and how each is read.

Any dataset's column names map onto gyre's three (``data.prompt_key``, ``data.answer_key``,
``data.tag_key``, or a ``data.prompt_template`` over several columns); every other column is kept, as
plain JSON-able data, for the reward function's keyword arguments. A missing column is an error naming
the row, the columns it has and the key to set.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from gyre.config.data_schema import DataConfig
from gyre.data.answers import last_boxed
from gyre.data.sources import DataError, RawRow

Chat = list[dict[str, str]]
MISSING = object()
"""What ``lookup`` returns for a row without the column."""


def lookup(data: dict[str, Any], key: str) -> Any:
    """``data[key]``, or for a dotted key not itself a column the value inside nested objects
    ("reward_model.ground_truth"); ``MISSING`` when there is none."""
    if key in data:
        return data[key]
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return node


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data (checkpoints hold it); what JSON cannot hold (dates, bytes) becomes text."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    return json.loads(json.dumps(value, default=str, ensure_ascii=False))


@dataclass(frozen=True)
class ColumnMap:
    """How one kind of row is read. ``section`` names the config section whose keys these are, for the
    error messages ("data"); None for a format with fixed names."""

    prompt_key: str = "prompt"
    answer_key: str | dict[str, str] | None = "ground_truth"
    """None: rows have no answer (prompts to generate from); ``answer`` gives ""."""
    tag_key: str | None = "tag"
    prompt_template: str | None = None
    answer_pattern: str | None = None
    answer_boxed: bool = False
    section: str | None = "data"

    @classmethod
    def from_config(cls, data: DataConfig) -> ColumnMap:
        return cls(data.prompt_key, data.answer_key, data.tag_key, data.prompt_template, data.answer_pattern,
                   data.answer_boxed)

    # ---- prompt -----------------------------------------------------------------------------------
    def prompt(self, row: RawRow) -> str | Chat:
        """The prompt as a text or a chat (a non-empty list of {"role": str, "content": str})."""
        if self.prompt_template is not None:
            return self._fill_template(row)
        key, value = self._prompt_column(row)
        if value is MISSING:
            raise self._missing(row, self.prompt_key, "prompt_key", "the prompt (or set data.prompt_template)")
        return text_or_chat(value, row.where, key)

    def _prompt_column(self, row: RawRow) -> tuple[str, Any]:
        value = lookup(row.data, self.prompt_key)
        if value is MISSING and self.prompt_key == "prompt" and "messages" in row.data:
            return "messages", row.data["messages"]
        return self.prompt_key, value

    def _fill_template(self, row: RawRow) -> str:
        values = {k: "" if v is None else v for k, v in row.data.items()}
        try:
            return self.prompt_template.format_map(values)
        except KeyError as exc:
            raise self._missing(row, str(exc.args[0]), "prompt_template", "a field of the template") from None
        except (IndexError, ValueError, TypeError) as exc:
            raise DataError(f"{row.where}: data.prompt_template {self.prompt_template!r} cannot be filled from this "
                            f"row: {type(exc).__name__}: {exc}") from None

    # ---- answer and tag ---------------------------------------------------------------------------
    def answer(self, row: RawRow) -> str:
        """The ground truth: the answer column as text, then the configured extraction."""
        if self.answer_key is None:
            return ""
        if isinstance(self.answer_key, dict):
            return self._assembled(row, self.answer_key)
        value = lookup(row.data, self.answer_key)
        if value is MISSING or value is None:
            error = self._missing(row, self.answer_key, "answer_key", "the answers")
            if self.section == "data":
                error = DataError(f"{error} Rows without answers (a judge or a reward model scores them): set "
                                  "data.answer_key to null.")
            raise error
        if isinstance(value, bool):
            raise DataError(f"{row.where}: '{self.answer_key}' must be a text, a number, or an object or list "
                            "(written as JSON), got a boolean")
        text = _answer_text(value)
        if self.answer_boxed:
            boxed = last_boxed(text)
            if boxed is None:
                raise DataError(f"{row.where}: '{self.answer_key}' has no complete \\boxed{{...}} (data.answer_boxed "
                                f"is true): {text[-120:]!r}")
            return boxed.strip()
        if self.answer_pattern is not None:
            matches = list(re.finditer(self.answer_pattern, text))
            if not matches:
                raise DataError(f"{row.where}: data.answer_pattern {self.answer_pattern!r} does not match "
                                f"'{self.answer_key}': {text[-120:]!r}")
            return matches[-1].group(1).strip()
        return text

    def _assembled(self, row: RawRow, fields: dict[str, str]) -> str:
        """The answer as the JSON object {field: column value} (a code test kept in several columns)."""
        out = {}
        for field, column in fields.items():
            value = lookup(row.data, column)
            if value is MISSING:
                raise self._missing(row, column, "answer_key", f"the answer's {field!r}")
            out[field] = jsonable(value)
        return json.dumps(out, ensure_ascii=False)

    def tag(self, row: RawRow) -> str | None:
        if self.tag_key is None:
            return None
        tag = lookup(row.data, self.tag_key)
        if tag is MISSING or tag is None:
            return None
        if not isinstance(tag, str):
            raise DataError(f"{row.where}: '{self.tag_key}' must be a string, got {type(tag).__name__}")
        return tag

    def others(self, row: RawRow) -> dict[str, Any]:
        """The columns not read as the prompt or tag, as plain JSON-able data. The answer column is kept as
        written (a reward may want the worked solution that ``answer_pattern`` took the answer from), and a
        dotted key's parent column too (it may hold more than the value read)."""
        used = {self.tag_key}
        if self.prompt_template is None:
            used.add(self._prompt_column(row)[0])
        return {k: jsonable(v) for k, v in row.data.items() if k not in used}

    def _missing(self, row: RawRow, column: str, key: str, what: str) -> DataError:
        return missing_column(row, column, self.section, key, what)


ROLES = ("system", "developer", "user", "assistant", "tool", "function", "ipython")
"""The message roles chat templates know."""
SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "system": "system", "user": "user",
                  "assistant": "assistant", "tool": "tool", "observation": "tool"}
"""ShareGPT's ``{"from", "value"}`` messages (LLaMA-Factory, FastChat), by their speaker names."""


def text_or_chat(value: Any, where: str, key: str) -> str | Chat:
    """``value`` (column ``key`` of the row at ``where``) as a non-empty text or a chat: a non-empty list of
    {"role", "content": str} messages with known roles (ShareGPT's {"from", "value"} are read as such; other
    keys of a message are dropped); else an error naming both."""
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
        return chat_messages(value, where, key)
    raise DataError(f"{where}: '{key}' must be a non-empty text or a chat: a non-empty list of "
                    f"{{'role': str, 'content': str}} (got {_describe(value)})")


def chat_messages(value: list[dict], where: str, key: str) -> Chat:
    """A list of message objects as a chat; an error naming the first message that is not one."""
    chat = []
    for i, m in enumerate(value):
        if "role" not in m and isinstance(m.get("from"), str) and "value" in m:
            role = SHAREGPT_ROLES.get(m["from"])
            m = {"role": role or m["from"], "content": m["value"]}
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str) or not isinstance(content, str):
            raise DataError(f"{where}: '{key}' message {i} must be {{'role': str, 'content': str}}, got "
                            f"{_clip(m)}; a chat is a list of such messages")
        if role not in ROLES:
            raise DataError(f"{where}: '{key}' message {i} has the role {role!r}; chat templates know the roles "
                            f"{', '.join(ROLES)} (ShareGPT's {{'from': 'human'|'gpt', 'value'}} are read as user "
                            "and assistant): rename it in the data")
        chat.append({"role": role, "content": content})
    return chat


def _clip(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def missing_column(row: RawRow, column: str, section: str | None, key: str, what: str) -> DataError:
    """The error for a row without ``column``: the columns it has, and the config key ``section.key`` that
    names the column holding ``what`` (no key to set when ``section`` is None: a format with fixed names)."""
    columns = ", ".join(sorted(row.data)) or "none"
    if section is None:
        return DataError(f"{row.where}: no column '{column}'; this row has columns: {columns}. Rows need a "
                         f"'{column}' column.")
    if key == "prompt_template":
        fix = f"name only existing columns in {section}.prompt_template"
    else:
        fix = f"set {section}.{key} to the column that holds {what}"
    return DataError(f"{row.where}: no column '{column}' ({section}.{key}); this row has columns: "
                     f"{columns}. {fix[0].upper() + fix[1:]}.")


def _answer_text(value: Any) -> str:
    """Text as is, numbers written out, objects and lists (code tests) as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(jsonable(value), ensure_ascii=False)


def _describe(value: Any) -> str:
    if isinstance(value, str):
        return "an empty text"
    if isinstance(value, list):
        return "an empty list" if not value else f"a list whose first item is {str(value[0])[:60]!r}"
    return type(value).__name__
