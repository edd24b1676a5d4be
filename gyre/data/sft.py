"""Supervised fine-tuning rows as token ids with a loss mask, and the trainer batches made of them.

A row is a (prompt, response) pair, trained on the response and an EOS token (or, for a response given
as assistant messages, on those messages as the chat template writes them after the prompt); a
conversation (a chat and no response column), trained on its assistant messages only; or a plain text,
trained whole. Which tokens a conversation's assistant messages are is read
off the tokenizer's chat template by rendering prefixes of the conversation: the text up to an
assistant message with the generation prompt, and the text up to the end of that message; the
characters between the two are the message as the template writes it (its end-of-turn marker
included), and the tokens that start there are trained. This works for any template, with or without
``{% generation %}`` markers, as long as rendering a prefix gives a prefix of the whole conversation
(a template that rewrites earlier turns, e.g. drops their reasoning, is an error naming the row).

Batches are padded (one example per row) or packed: several examples per row, each with its own
positions from 0, which makes transformers keep attention within each example (its packed-sequence
masks for sdpa and eager; varlen kernels for flash attention), so the packed loss equals the padded one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from gyre.config.data_schema import DataSource
from gyre.data.columns import MISSING, Chat, lookup, missing_column, text_or_chat
from gyre.data.prompts import TEMPLATE_FIX, PromptRenderer
from gyre.data.sources import DataError, RawRow, read_sources
from gyre.types import TrainBatch


@dataclass
class SFTExample:
    uid: str
    """Where the row came from ("file:line")."""
    input_ids: list[int]
    loss_mask: list[int]
    """1 on the tokens the loss trains (the response, or the assistant messages), 0 elsewhere."""

    @property
    def prompt_length(self) -> int:
        """Tokens before the first trained one."""
        return self.loss_mask.index(1)


@dataclass(frozen=True)
class SFTColumns:
    """Which columns hold a pair's prompt and response, or a conversation (``SFTConfig``'s keys)."""

    prompt_key: str = "prompt"
    response_key: str = "response"
    messages_key: str = "messages"
    section: str = "sft_warmup"
    """The config section of these keys, for messages."""
    text_key: str = "text"

    @classmethod
    def from_config(cls, sft, section: str) -> SFTColumns:
        return cls(sft.prompt_key, sft.response_key, sft.messages_key, section, sft.text_key)


def load_sft_examples(sources: Iterable[DataSource], renderer: PromptRenderer, eos_id: int, max_tokens: int,
                      columns: SFTColumns = SFTColumns(), overlong: Literal["error", "drop"] = "error"
                      ) -> tuple[list[SFTExample], int]:
    """Every row as an example; returns (examples, how many were dropped as longer than ``max_tokens``)."""
    examples, dropped = [], 0
    for row in read_sources(sources):
        ids, mask = example_tokens(row, renderer, eos_id, columns)
        if len(ids) > max_tokens:
            if overlong == "drop":
                dropped += 1
                continue
            raise DataError(f"{row.where}: the example is {len(ids)} tokens, over {columns.section}.max_tokens="
                            f"{max_tokens}; raise it, or set {columns.section}.overlong=drop")
        examples.append(SFTExample(row.where, ids, mask))
    if not examples:
        raise DataError(f"no SFT examples left: all {dropped} are longer than {columns.section}.max_tokens="
                        f"{max_tokens}")
    return examples, dropped


def example_tokens(row: RawRow, renderer: PromptRenderer, eos_id: int, columns: SFTColumns
                   ) -> tuple[list[int], list[int]]:
    """A row in any SFT layout as (token ids, loss mask): a (prompt, response) pair, a conversation, or a
    plain text. TRL's names are found under gyre's defaults: ``completion`` for the response, and ShareGPT's
    ``conversations`` for the messages."""
    response = _column(row, columns.response_key, "response", "completion")
    if response is not None:
        return pair_tokens(row, response, renderer, eos_id, columns)
    messages = _column(row, columns.messages_key, "messages", "conversations")
    if messages is not None:
        return conversation_tokens(_chat(row, messages, columns.section), renderer, row.where)
    text = _column(row, columns.text_key, "text")
    if text is not None:
        return text_tokens(row, text, renderer, eos_id, columns)
    have = ", ".join(sorted(row.data)) or "none"
    raise DataError(f"{row.where}: no column '{columns.response_key}' ({columns.section}.response_key), no "
                    f"conversation in '{columns.messages_key}' ({columns.section}.messages_key) and no text in "
                    f"'{columns.text_key}' ({columns.section}.text_key); this row has columns: {have}. Set the key "
                    "that names the target column.")


def _column(row: RawRow, key: str, default: str, *also: str) -> str | None:
    """The column ``key`` if the row has it (and not null); with the default key, the first of its other
    conventional names ``also`` the row has."""
    for name in (key, *also) if key == default else (key,):
        if lookup(row.data, name) not in (MISSING, None):
            return name
    return None


def pair_tokens(row: RawRow, response_key: str, renderer: PromptRenderer, eos_id: int, columns: SFTColumns
                ) -> tuple[list[int], list[int]]:
    """A (prompt, response) row: the rendered prompt, then the response and EOS (trained); a response given
    as messages (TRL's conversational prompt-completion) trained as the chat template writes them."""
    key = columns.prompt_key
    if lookup(row.data, key) is MISSING and columns.messages_key in row.data:
        key = columns.messages_key  # a chat prompt in the conversation column
    value = lookup(row.data, key)
    if value is MISSING or value is None:
        raise missing_column(row, key, columns.section, "prompt_key", "the prompts")
    prompt = text_or_chat(value, row.where, key)
    completion = _completion(row, response_key, columns.section)
    return completion_tokens(prompt, completion, renderer, eos_id, row.where)


def _completion(row: RawRow, key: str, section: str) -> str | Chat:
    value = lookup(row.data, key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str) and not value.strip():
        raise DataError(f"{row.where}: '{key}' is empty, so the example would train only an end-of-sequence token; "
                        "remove the row or fill in its response")
    if isinstance(value, list) and value:
        chat = text_or_chat(value, row.where, key)
        if chat[0]["role"] != "assistant":
            raise DataError(f"{row.where}: '{key}' is a list of messages that starts with a {chat[0]['role']} "
                            "message; a completion given as messages starts with the assistant's reply (the turns "
                            f"before it belong in the prompt, {section}.prompt_key)")
        return chat
    if not isinstance(value, str):
        raise DataError(f"{row.where}: '{key}' must be a text or a list of messages starting with the assistant's "
                        f"(got {type(value).__name__ if not isinstance(value, list) else 'an empty list'})")
    return value


def text_tokens(row: RawRow, key: str, renderer: PromptRenderer, eos_id: int, columns: SFTColumns
                ) -> tuple[list[int], list[int]]:
    """A plain text row (TRL's language-modeling layout): every token and EOS trained, no template."""
    value = lookup(row.data, key)
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{row.where}: '{key}' ({columns.section}.text_key) must be a non-empty text, got "
                        f"{'an empty text' if isinstance(value, str) else type(value).__name__}")
    ids = list(renderer.tokenizer(value)["input_ids"]) + [eos_id]
    return ids, [1] * len(ids)


def completion_tokens(prompt: str | Chat, completion: str | Chat, renderer: PromptRenderer, eos_id: int,
                      where: str) -> tuple[list[int], list[int]]:
    """The rendered prompt (not trained), then the completion (trained): a text and EOS, or messages as the
    chat template writes them after the prompt (their end-of-turn markers included)."""
    prompt_text = renderer.render(prompt, where)
    prompt_ids = renderer.encode(prompt_text)
    if isinstance(completion, str):
        ids = list(renderer.tokenizer(completion, add_special_tokens=False)["input_ids"]) + [eos_id]
    else:
        if not renderer.use_template:
            raise DataError(f"{where}: a completion given as messages needs a tokenizer chat template, and this one "
                            f"has none; give the completion as a text, or {TEMPLATE_FIX}")
        chat = ([{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)) + completion
        full = renderer.render_chat(chat, add_generation_prompt=False)
        if not full.startswith(prompt_text):
            raise DataError(f"{where}: the chat template does not write the prompt followed by the completion as "
                            "the prompt with a generation prompt and then the completion (templates that rewrite "
                            "earlier turns do this); give the completion as a text instead of messages")
        ids = list(renderer.tokenizer(full[len(prompt_text):], add_special_tokens=False)["input_ids"])
    return prompt_ids + ids, [0] * len(prompt_ids) + [1] * len(ids)


def _chat(row: RawRow, key: str, section: str) -> Chat:
    value = lookup(row.data, key)
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:  # a conversation stored as JSON text (CSV files can hold nothing else)
            value = json.loads(value)
        except json.JSONDecodeError:
            pass
    if not isinstance(value, list):
        what = "a text" if isinstance(value, str) else type(value).__name__
        raise DataError(f"{row.where}: '{key}' holds {what}; a conversation is a list of {{'role', 'content'}} "
                        f"messages (or give the target in a response column, {section}.response_key)")
    return text_or_chat(value, row.where, key)


def conversation_tokens(chat: Chat, renderer: PromptRenderer, where: str) -> tuple[list[int], list[int]]:
    """The whole conversation through the chat template, trained on its assistant messages."""
    if not renderer.use_template:
        raise DataError(f"{where}: a conversation needs a tokenizer chat template, and this one has none; give "
                        f"(prompt, response) pairs instead, or {TEMPLATE_FIX}")
    full = renderer.render_chat(chat, add_generation_prompt=False)
    spans = []
    for i, message in enumerate(chat):
        if message["role"] != "assistant":
            continue
        if i == 0:
            raise DataError(f"{where}: the conversation starts with an assistant message; it needs a user turn first")
        before = renderer.render_chat(chat[:i], add_generation_prompt=True)
        through = renderer.render_chat(chat[:i + 1], add_generation_prompt=False)
        if not (through.startswith(before) and full.startswith(through)):
            raise DataError(f"{where}: the chat template does not write this conversation as the sum of its turns "
                            f"(rendering up to message {i} is not a prefix of the whole; templates that rewrite "
                            "earlier turns do this). Split it into one row per assistant message, with the turns "
                            "before it as a chat prompt and the message as the response.")
        spans.append((len(before), len(through)))
    if not spans:
        raise DataError(f"{where}: the conversation has no assistant message to train on")
    try:
        encoded = renderer.tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    except NotImplementedError:
        raise DataError(f"{where}: finding the assistant tokens needs a fast tokenizer (a tokenizer.json); this "
                        "tokenizer gives no character offsets") from None
    mask = [int(any(lo <= start < hi for lo, hi in spans)) for start, _ in encoded["offset_mapping"]]
    return list(encoded["input_ids"]), mask


def pack_rows(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Example indices per row, each row at most ``capacity`` tokens: first fit, longest first (ties in
    index order), so the same examples always give the same rows."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        slot = next((r for r, free in enumerate(room) if free >= lengths[i]), None)
        if slot is None:
            rows.append([])
            room.append(capacity)
            slot = len(rows) - 1
        rows[slot].append(i)
        room[slot] -= lengths[i]
    return rows


def sft_batch(examples: Sequence[SFTExample], pad_id: int, pack_tokens: int | None = None,
              rows_multiple: int = 1) -> TrainBatch:
    """Right-padded trainer rows: one example each, or (``pack_tokens``) packed into rows of at most that
    many tokens with per-example positions; then empty rows (one pad token, nothing trained) up to a
    multiple of ``rows_multiple`` (data-parallel ranks need equal shares)."""
    lengths = [len(e.input_ids) for e in examples]
    rows = pack_rows(lengths, pack_tokens) if pack_tokens else [[i] for i in range(len(examples))]
    b = -(-len(rows) // rows_multiple) * rows_multiple
    width = max(sum(lengths[i] for i in row) for row in rows)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    attention = torch.zeros((b, width), dtype=torch.long)
    attention[len(rows):, 0] = 1  # empty rows: one token, so that every row has something to attend to
    mask = torch.zeros((b, width), dtype=torch.float32)
    positions = torch.arange(width).repeat(b, 1) if pack_tokens else None
    for r, row in enumerate(rows):
        at = 0
        for i in row:
            n = lengths[i]
            ids[r, at:at + n] = torch.tensor(examples[i].input_ids, dtype=torch.long)
            mask[r, at:at + n] = torch.tensor(examples[i].loss_mask, dtype=torch.float32)
            mask[r, at] = 0.0  # an example's first token follows nothing of its own: it cannot be trained
            attention[r, at:at + n] = 1
            if positions is not None:
                positions[r, at:at + n] = torch.arange(n)
            at += n
        if positions is not None:  # the padding after the last example: a sequence of its own
            positions[r, at:] = torch.arange(width - at)
    zeros = torch.zeros((b, width), dtype=torch.float32)
    return TrainBatch(input_ids=ids, attention_mask=attention, response_mask=mask, advantages=zeros,
                      rollout_logprobs=zeros.clone(), position_ids=positions)
