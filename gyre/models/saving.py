"""Write a trained model as a Hugging Face directory the way its owner gave it to gyre.

The trainer holds float32 master weights whatever the input was, and gyre's tokenizer object is
adjusted for sampling (a pad token, left padding). Saved as they are, a bfloat16 model would come back
twice its size in float32, and the tokenizer config would carry gyre's changes. So the weights are cast
to the input's dtype (or the one asked for), and the tokenizer files are copied byte for byte from the
directory they were loaded from.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from gyre.models.checks import WEIGHT_FILES

DTYPES = ("float32", "bfloat16", "float16")
_SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
# Every file a tokenizer's save_pretrained writes (any tokenizer class), and remote-code tokenizers' modules.
TOKENIZER_PATTERNS = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "tokenizer.json",
                      "tokenizer.model", "vocab.json", "vocab.txt", "merges.txt", "spiece.model",
                      "sentencepiece.bpe.model", "chat_template.jinja", "chat_template.json", "*.tiktoken",
                      "tokenization_*.py")


def stored_dtype(directory: str | Path) -> str | None:
    """The dtype the model in ``directory`` is stored in: its config.json's ``dtype`` (``torch_dtype``
    before transformers 5), else the first floating tensor of its safetensors weights; None when
    neither says (or the directory is unreadable: its pre-flight check reports that)."""
    d = Path(directory)
    try:
        config = json.loads((d / "config.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if isinstance(config, dict):
        for name in ("dtype", "torch_dtype"):
            if config.get(name) in DTYPES:
                return config[name]
    return _safetensors_dtype(d)


def _safetensors_dtype(directory: Path) -> str | None:
    files = []
    if (directory / WEIGHT_FILES[0]).is_file():
        files = [directory / WEIGHT_FILES[0]]
    elif (directory / WEIGHT_FILES[1]).is_file():
        try:
            files = [directory / s for s in sorted(set(json.loads((directory / WEIGHT_FILES[1]).read_text())
                                                          ["weight_map"].values()))[:1]]
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
            return None
    for path in files:
        try:
            with path.open("rb") as fh:
                header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        except (OSError, UnicodeDecodeError, ValueError, MemoryError):
            return None
        for name, info in header.items():
            if name != "__metadata__" and isinstance(info, dict) and info.get("dtype") in _SAFETENSORS_DTYPES:
                return _SAFETENSORS_DTYPES[info["dtype"]]
    return None


def copy_tokenizer_files(source: str | Path, directory: str | Path) -> list[Path]:
    """Copy the tokenizer files of ``source`` into ``directory`` unchanged (links in a Hub cache
    snapshot are followed); returns the copies."""
    src, dst = Path(source), Path(directory)
    copied = []
    for pattern in TOKENIZER_PATTERNS:
        for path in sorted(src.glob(pattern)):
            if path.is_file():
                copied.append(Path(shutil.copyfile(path, dst / path.name)))
    return copied


def save_hf_model(model, state: dict, directory: str | Path, dtype: str, tokenizer_source: str | Path) -> None:
    """Write ``state`` (the weights of ``model``, a transformers model) to ``directory`` in ``dtype``,
    with config.json saying so, and the tokenizer files of ``tokenizer_source`` beside them."""
    import torch

    target = getattr(torch, dtype)
    state = share_tied_weights(model, {k: v.to(target) if v.is_floating_point() else v for k, v in state.items()})
    model.save_pretrained(directory, state_dict=state)
    # save_pretrained records the dtype of the model's own parameters (the float32 masters): rewrite it.
    recorded = model.config.dtype
    model.config.dtype = dtype
    try:
        model.config.save_pretrained(directory)
    finally:
        model.config.dtype = recorded
    copy_tokenizer_files(tokenizer_source, directory)


def share_tied_weights(model, state: dict) -> dict:
    """``state`` with every name of a tied parameter (input and output embeddings) on one tensor, as in a
    loaded model, so that ``save_pretrained`` writes it once. A gathered (FSDP2) or checkpointed state
    holds a separate copy under each name."""
    first: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        owner = first.setdefault(id(param), name)
        if owner != name and owner in state and name in state:
            state[name] = state[owner]
    return state
