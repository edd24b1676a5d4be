"""Pairwise preference rows (TRL's formats) as token ids with loss masks, and trainer batches of whole pairs.

A row holds a prompt and two completions, the preferred ``chosen`` and the ``rejected`` one, in one of
the forms TRL's DPOTrainer reads (column names are ``dpo.prompt_key``, ``chosen_key``, ``rejected_key``):

- explicit prompt: ``prompt``, ``chosen`` and ``rejected`` as texts (TRL's standard format), or the prompt
  as a chat and the completions as lists of assistant messages (conversational);
- implicit prompt: ``chosen`` and ``rejected`` alone, two whole conversations (or texts) that begin alike:
  the prompt is their common beginning (whole messages; for texts, characters up to the last point before
  they differ, a space there going to the completions, as TRL's ``extract_prompt``).

Each completion is tokenised after the same rendered prompt as ``gyre sft`` tokenises a (prompt, response)
pair (``gyre.data.sft.completion_tokens``: a text and EOS, or the messages as the chat template writes
them); the loss mask covers the completion. Pairs longer than ``max_tokens`` (either sequence) are an
error, dropped, or truncated: each sequence cut to its first ``max_tokens`` tokens (TRL's ``keep_start``),
and a pair whose prompt alone fills them dropped, since no completion token would be left to compare.

A batch lays a pair's two sequences on adjacent rows (chosen at 2i, rejected at 2i + 1), so that a
contiguous slice of pairs (a rank's share, a micro-batch) always holds whole pairs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from gyre.config.data_schema import DataSource
from gyre.data.columns import MISSING, Chat, lookup, missing_column, text_or_chat
from gyre.data.prompts import PromptRenderer
from gyre.data.sft import SFTExample, completion_tokens, sft_batch
from gyre.data.sources import DataError, RawRow, read_sources
from gyre.types import PreferenceBatch, TrainBatch

PairOverlong = Literal["error", "drop", "truncate"]


@dataclass
class PreferencePair:
    uid: str
    """Where the row came from ("file:line")."""
    chosen: SFTExample
    rejected: SFTExample
    ref_chosen: float | None = None
    """The chosen completion's log-prob under the reference model, summed over its tokens (computed once,
    before training); None until then, and for a reference-free loss."""
    ref_rejected: float | None = None


@dataclass(frozen=True)
class PreferenceColumns:
    """Which columns hold a pair's prompt and completions (the ``dpo`` section's keys)."""

    prompt_key: str = "prompt"
    chosen_key: str = "chosen"
    rejected_key: str = "rejected"
    section: str = "dpo"
    """The config section of these keys, for messages."""

    @classmethod
    def from_config(cls, dpo, section: str = "dpo") -> PreferenceColumns:
        return cls(dpo.prompt_key, dpo.chosen_key, dpo.rejected_key, section)


@dataclass
class PairCount:
    """Pairs over the token limit, by what was done with them."""

    dropped: int = 0
    truncated: int = 0

    def describe(self, max_tokens: int, section: str = "dpo") -> str:
        """"; 2 dropped, 1 truncated (longer than dpo.max_tokens=512)", or ""."""
        parts = [f"{n} {what}" for n, what in ((self.dropped, "dropped"), (self.truncated, "truncated")) if n]
        return f"; {', '.join(parts)} (longer than {section}.max_tokens={max_tokens})" if parts else ""


def load_preference_pairs(sources: Iterable[DataSource], renderer: PromptRenderer, eos_id: int, max_tokens: int,
                          columns: PreferenceColumns = PreferenceColumns(), overlong: PairOverlong = "error"
                          ) -> tuple[list[PreferencePair], PairCount]:
    """Every row as a tokenised pair; returns (pairs, the over-long pairs dropped or truncated)."""
    pairs, count = [], PairCount()
    for row in read_sources(sources):
        pair = tokenize_pair(row, columns, renderer, eos_id)
        longest = max(len(pair.chosen.input_ids), len(pair.rejected.input_ids))
        if longest <= max_tokens:
            pairs.append(pair)
        elif overlong == "error":
            raise DataError(f"{row.where}: the pair is {len(pair.chosen.input_ids)} tokens (chosen) and "
                            f"{len(pair.rejected.input_ids)} (rejected), over {columns.section}.max_tokens="
                            f"{max_tokens}; raise it, or set {columns.section}.overlong to drop or truncate")
        elif overlong == "truncate" and pair.chosen.prompt_length < max_tokens:
            pairs.append(PreferencePair(pair.uid, _cut(pair.chosen, max_tokens), _cut(pair.rejected, max_tokens)))
            count.truncated += 1
        else:
            count.dropped += 1
    if not pairs:
        raise DataError(f"no preference pairs left: all {count.dropped} are longer than {columns.section}.max_tokens="
                        f"{max_tokens}; raise it")
    return pairs, count


def tokenize_pair(row: RawRow, columns: PreferenceColumns, renderer: PromptRenderer, eos_id: int) -> PreferencePair:
    """A row's chosen and rejected sequences: the same rendered prompt, then each completion (trained)."""
    prompt, chosen, rejected = read_pair(row, columns)
    examples = [SFTExample(row.where, *completion_tokens(prompt, c, renderer, eos_id, row.where))
                for c in (chosen, rejected)]
    return PreferencePair(row.where, *examples)


def _cut(example: SFTExample, max_tokens: int) -> SFTExample:
    return SFTExample(example.uid, example.input_ids[:max_tokens], example.loss_mask[:max_tokens])


def read_pair(row: RawRow, columns: PreferenceColumns) -> tuple[str | Chat, str | Chat, str | Chat]:
    """(prompt, chosen completion, rejected completion) of a row in any of the module docstring's forms."""
    chosen, rejected = (_completion(row, key, name, columns) for key, name in
                        ((columns.chosen_key, "chosen_key"), (columns.rejected_key, "rejected_key")))
    if chosen == rejected:
        raise DataError(f"{row.where}: '{columns.chosen_key}' and '{columns.rejected_key}' are the same completion; a "
                        "pair that prefers a completion to itself teaches nothing (its loss is constant): remove the "
                        "row, or fix the column mapping")
    value = lookup(row.data, columns.prompt_key)
    if value is not MISSING and value is not None:
        return text_or_chat(value, row.where, columns.prompt_key), chosen, rejected
    if isinstance(chosen, str) != isinstance(rejected, str):
        raise DataError(f"{row.where}: without a '{columns.prompt_key}' column ({columns.section}.prompt_key), "
                        f"'{columns.chosen_key}' and '{columns.rejected_key}' must both be conversations or both "
                        "texts that begin with the same prompt; give the prompt in its own column")
    split = _text_prompt(chosen, rejected) if isinstance(chosen, str) else _chat_prompt(chosen, rejected)
    if split is None:
        raise DataError(f"{row.where}: there is no '{columns.prompt_key}' column ({columns.section}.prompt_key), and "
                        f"'{columns.chosen_key}' and '{columns.rejected_key}' do not share a prompt followed by two "
                        "different completions (they differ from the start, are equal, or one continues the other); "
                        f"put the prompt in its own column, or set {columns.section}.prompt_key to the column that "
                        "holds it")
    return split


def _completion(row: RawRow, key: str, config_key: str, columns: PreferenceColumns) -> str | Chat:
    value = lookup(row.data, key)
    if value is MISSING or value is None:
        raise missing_column(row, key, columns.section, config_key, f"the {config_key[:-4]} completions")
    return text_or_chat(value, row.where, key)


def _chat_prompt(chosen: Chat, rejected: Chat) -> tuple[Chat, Chat, Chat] | None:
    """The shared first messages of two conversations, and what follows in each."""
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    if n == 0 or n == len(chosen) or n == len(rejected):
        return None
    return chosen[:n], chosen[n:], rejected[n:]


def _text_prompt(chosen: str, rejected: str) -> tuple[str, str, str] | None:
    """The shared beginning of two texts (a space where they part goes to the completions), and the rests."""
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    if n > 0 and chosen[n - 1] == " ":
        n -= 1
    if n == 0 or n == len(chosen) or n == len(rejected):
        return None
    return chosen[:n], chosen[n:], rejected[n:]


def preference_batch(pairs: Sequence[PreferencePair], pad_id: int, with_reference: bool = True) -> PreferenceBatch:
    """The trainer batch of ``pairs`` (their reference log-probs too, ``with_reference``: they must be known)."""
    rows = sft_batch([e for p in pairs for e in (p.chosen, p.rejected)], pad_id)
    if not with_reference:
        return PreferenceBatch(rows)
    if any(p.ref_chosen is None or p.ref_rejected is None for p in pairs):
        raise ValueError("the pairs' reference log-probs were not computed")
    return PreferenceBatch(rows, torch.tensor([p.ref_chosen for p in pairs], dtype=torch.float32),
                           torch.tensor([p.ref_rejected for p in pairs], dtype=torch.float32))


def sequence_sums(logprobs: torch.Tensor, rows: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row log-prob sums over the completion tokens and the completion lengths, both [2P] (``logprobs``
    [2P, L] aligned with ``rows``)."""
    mask = rows.response_mask.to(logprobs.device)
    return (logprobs * mask).sum(dim=1), mask.sum(dim=1)
