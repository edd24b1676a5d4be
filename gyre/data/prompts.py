"""Prompt datasets, validated row by row and tokenised.

Rows come from ``gyre.data.sources`` (files, directories, globs, datasets) and are read through a
``ColumnMap`` (``gyre.data.columns``): the prompt (a text or a chat), the answer (``ground_truth`` for
RL rows; SFT rows are read by ``gyre.data.sft``), an optional tag, and every other column, kept for the reward
function. A malformed row is an error that names its file and line, raised while loading, before any
training starts. Prompts longer than the limit are dropped, cut from the left, or an error
(``data.overlong_prompts``), and counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from gyre.config.data_schema import DataSource
from gyre.data.columns import Chat, ColumnMap
from gyre.data.sources import DataError, RawRow, read_rows, read_sources
from gyre.types import PromptRecord

__all__ = ["DataError", "RawRow", "read_rows", "PromptRenderer", "OverlongCount", "load_prompts"]

OverlongPolicy = Literal["error", "drop", "truncate_left"]
TEMPLATE_FIX = ("supply a template: save the tokenizer with one (tokenizer.chat_template = ...; save_pretrained(DIR)) "
                "and set model.tokenizer_path to DIR (gyre init-model writes its presets with a plain one)")
"""How to give a tokenizer without a chat template one, for the errors that need it."""
RL_COLUMNS = ColumnMap()
"""RL rows with gyre's own column names: ``prompt`` (or ``messages``), ``ground_truth``, ``tag``."""


class PromptRenderer:
    """Turns a prompt (a text or a chat) into the exact text and token ids the model sees: through the
    tokenizer's chat template when there is one (and ``chat_template`` is not "never"), with the
    system prompt and the template's extra arguments."""

    def __init__(self, tokenizer, chat_template: str = "auto", system_prompt: str | None = None,
                 template_kwargs: dict | None = None, section: str = "data"):
        """``section``: the config section of these settings, for messages ("sft" for gyre sft)."""
        self.tokenizer = tokenizer
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if chat_template == "always" and not has_template:
            raise DataError('data.chat_template is "always" but the tokenizer has no chat template')
        self.use_template = has_template and chat_template != "never"
        self.system_prompt = system_prompt
        self.template_kwargs = dict(template_kwargs or {})
        for key, value in (("system_prompt", system_prompt), ("chat_template_kwargs", self.template_kwargs)):
            if value and not self.use_template:
                raise DataError(f"{section}.{key} needs a chat template, and this tokenizer has none (or "
                                "data.chat_template is 'never'): remove it, or put the instruction in the prompt text")

    def render(self, prompt: str | Chat, where: str = "") -> str:
        if isinstance(prompt, str) and not self.use_template:
            return prompt
        if not self.use_template:
            raise DataError(f"{where}: chat prompts need a tokenizer chat template; this one has none (or "
                            f"data.chat_template is 'never'): give the prompt as text instead, or {TEMPLATE_FIX}")
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        return self.render_chat(messages, add_generation_prompt=True)

    def render_chat(self, messages: Chat, add_generation_prompt: bool) -> str:
        """A chat through the template, the system prompt first when the chat has none; with
        ``add_generation_prompt`` the text ends where the assistant's next message would begin."""
        messages = list(messages)
        if self.system_prompt and (not messages or messages[0]["role"] != "system"):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt, **self.template_kwargs)

    def encode(self, text: str) -> list[int]:
        # A chat template already writes any BOS token into the text.
        return list(self.tokenizer(text, add_special_tokens=not self.use_template)["input_ids"])


def question(prompt: str | Chat) -> str:
    """What was asked, without the chat template: the prompt text, or the chat's last user message."""
    if isinstance(prompt, str):
        return prompt
    users = [m["content"] for m in prompt if m["role"] == "user"]
    return users[-1] if users else prompt[-1]["content"]


@dataclass
class OverlongCount:
    """Prompts over the token limit, by what was done with them."""

    dropped: int = 0
    truncated: int = 0

    def __add__(self, other: OverlongCount) -> OverlongCount:
        return OverlongCount(self.dropped + other.dropped, self.truncated + other.truncated)

    def describe(self, max_tokens: int) -> str:
        """" (3 dropped, 1 truncated to its last 512 tokens: longer than data.max_prompt_tokens=512)", or
        " (none longer than data.max_prompt_tokens=512)": the count is always stated, zero included."""
        parts = [f"{self.dropped} dropped"] * bool(self.dropped) + \
            [f"{self.truncated} truncated to their last {max_tokens} tokens"] * bool(self.truncated)
        if not parts:
            return f" (none longer than data.max_prompt_tokens={max_tokens})"
        return f" ({', '.join(parts)}: longer than data.max_prompt_tokens={max_tokens})"


def load_prompts(sources: Iterable[DataSource], renderer: PromptRenderer, max_prompt_tokens: int,
                 columns: ColumnMap = RL_COLUMNS, overlong: OverlongPolicy = "drop"
                 ) -> tuple[list[PromptRecord], OverlongCount]:
    """RL prompt records from ``sources``; returns (records, the over-long prompts dropped or truncated)."""
    sources = list(sources)
    records, count, too_long = [], OverlongCount(), []
    for row in read_sources(sources):
        prompt = columns.prompt(row)
        text = renderer.render(prompt, row.where)
        truth, tag, others = columns.answer(row), columns.tag(row), columns.others(row)
        ids = renderer.encode(text)
        if len(ids) > max_prompt_tokens:
            too_long.append((row.where, len(ids)))
            if overlong == "drop":
                count.dropped += 1
                continue
            ids = ids[-max_prompt_tokens:]
            text = renderer.tokenizer.decode(ids)
            count.truncated += 1
        records.append(PromptRecord(uid=row.where, prompt_text=text, prompt_ids=ids, ground_truth=truth, tag=tag,
                                    question=question(prompt), columns=others,
                                    messages=prompt if isinstance(prompt, list) else None))
    if overlong == "error" and too_long:
        where, n = too_long[0]
        raise DataError(f"{len(too_long)} prompt(s) longer than data.max_prompt_tokens={max_prompt_tokens}, e.g. "
                        f"{where} ({n} tokens); raise data.max_prompt_tokens, or set data.overlong_prompts to drop "
                        "or truncate_left")
    if not records:
        raise DataError(f"no usable prompts in {_names(sources)}: all {count.dropped} are longer than "
                        f"data.max_prompt_tokens={max_prompt_tokens}; raise it")
    return records, count


def _names(sources: list[DataSource]) -> str:
    return ", ".join(s if isinstance(s, str) else s.dataset for s in sources)
