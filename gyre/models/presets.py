"""Tiny Llama-style models and a character-level tokenizer, built locally from a named preset.

Nothing can be downloaded on many machines gyre runs on (CI, air-gapped clusters), so a new user
starts from ``gyre init-model --preset tiny``: a randomly initialised model and a tokenizer saved as
an ordinary Hugging Face directory that every other part of gyre loads with ``from_pretrained``.
Llama configs are used because transformers maps Qwen2 directories to a tokenizer class that drops
spaces with custom vocabularies.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"


@dataclass(frozen=True)
class ModelPreset:
    hidden_size: int
    num_layers: int
    num_heads: int
    max_positions: int = 1024

    @property
    def intermediate_size(self) -> int:
        return 2 * self.hidden_size


PRESETS: dict[str, ModelPreset] = {
    "tiny": ModelPreset(hidden_size=128, num_layers=2, num_heads=4),
    "small": ModelPreset(hidden_size=256, num_layers=4, num_heads=4),
    "base": ModelPreset(hidden_size=512, num_layers=8, num_heads=8),
}


def build_char_tokenizer(model_max_length: int = 1024):
    """A character-level tokenizer over printable ASCII; round-trips such text exactly."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set(string.printable) - {"\x0b", "\x0c", "\r"})
    vocab = {tok: i for i, tok in enumerate([PAD, BOS, EOS, UNK, *chars])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    # padding_side must be given to the constructor: set afterwards it is not saved.
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK,
        padding_side="left", model_max_length=model_max_length, clean_up_tokenization_spaces=False)


CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] + ': ' + m['content'] }}"
                 "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\\n' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}")
"""A plain chat template in the character tokenizer's alphabet: "role: content" lines, each assistant turn
ending with EOS (so SFT on chats trains the model to stop)."""


def init_model(preset: str, out_dir: str | Path, seed: int = 0, chat_template: bool = False,
               overwrite: bool = True) -> Path:
    """Create a randomly initialised model + tokenizer directory from ``preset``; returns its path. With
    ``chat_template`` the tokenizer gets ``CHAT_TEMPLATE`` (chat data then works as is); without
    ``overwrite`` a directory that already holds files is refused (ValueError)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from gyre.models.loading import quiet_transformers

    quiet_transformers()
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; choose one of {', '.join(PRESETS)}")
    spec = PRESETS[preset]
    tokenizer = build_char_tokenizer(spec.max_positions)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads, max_position_embeddings=spec.max_positions,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    out = Path(out_dir)
    if not overwrite and out.is_dir() and any(out.iterdir()):
        raise ValueError(f"{out} already holds files; choose an empty or new directory, or pass --overwrite to "
                         "replace the model there")
    if chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE
    elif (out / "chat_template.jinja").is_file():  # a replaced model's template would outlive it
        (out / "chat_template.jinja").unlink()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
