"""Pre-flight checks of a model directory that read headers, never whole weights.

A damaged weight file or a missing tokenizer otherwise surfaces inside a Ray actor as a long
traceback; here it is one message naming the file and the fix, before Ray starts.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

# A safetensors header is JSON metadata, far below this; a larger length means the file is not one.
_MAX_HEADER = 100 << 20
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model")


class ModelPathError(ValueError):
    """The configured model directory is missing, damaged, or not a Hugging Face model directory."""


def check_config_json(directory: Path, key: str) -> None:
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelPathError(f"{key}: {directory / 'config.json'} is not valid JSON ({exc}); re-save the model "
                             "with save_pretrained()") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise ModelPathError(f"{key}: {directory / 'config.json'} has no 'model_type'; it is not a Hugging Face "
                             "model config (re-save the model with save_pretrained())")


def custom_code_files(directory: Path) -> list[str]:
    """The Python files a model's config.json names in its ``auto_map`` (its own architecture code, which
    transformers runs only with trust_remote_code); empty for a model transformers knows."""
    try:
        config = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return []
    auto_map = config.get("auto_map") if isinstance(config, dict) else None
    if not isinstance(auto_map, dict):
        return []
    refs = [r for v in auto_map.values() for r in (v if isinstance(v, (list, tuple)) else [v]) if isinstance(r, str)]
    # "module.Class", or "repo_id--module.Class" for code kept in another repository.
    return sorted({r.rpartition("--")[2].rpartition(".")[0] + ".py" for r in refs if "." in r})


def check_weights(directory: Path, key: str) -> None:
    """The weight files exist and their headers agree with their sizes (sharded indexes: every shard)."""
    present = [name for name in WEIGHT_FILES if (directory / name).is_file()]
    if not present:
        raise ModelPathError(f"{key}: no weights in {directory} (expected one of {', '.join(WEIGHT_FILES)}); "
                             "save the model there with save_pretrained()")
    name = present[0]
    if name.endswith(".index.json"):
        for shard in _shards(directory / name, key):
            _check_file(shard, key)
    else:
        _check_file(directory / name, key)


def check_tokenizer_files(directory: Path, key: str) -> None:
    if not any((directory / name).is_file() for name in TOKENIZER_FILES) and not any(directory.glob("*.tiktoken")):
        raise ModelPathError(
            f"{key}: no tokenizer files in {directory} (none of {', '.join(TOKENIZER_FILES)}). Save the tokenizer "
            f"there (tokenizer.save_pretrained('{directory}')), or set model.tokenizer_path to a directory that "
            "holds it.")


def _shards(index: Path, key: str) -> list[Path]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        shards = sorted({str(v) for v in weight_map.values()})
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise _damaged(index, key, f"not a valid index ({type(exc).__name__}: {exc})") from None
    missing = [s for s in shards if not (index.parent / s).is_file()]
    if missing:
        raise _damaged(index, key, f"it names {len(missing)} shard(s) that do not exist, e.g. {missing[0]}")
    return [index.parent / s for s in shards]


def _check_file(path: Path, key: str) -> None:
    if path.suffix == ".safetensors":
        problem = safetensors_problem(path)
    elif zipfile.is_zipfile(path):
        problem = None
    else:
        problem = "not a zip archive (the torch.save format)"
    if problem:
        raise _damaged(path, key, problem)


def safetensors_problem(path: Path) -> str | None:
    """Why ``path`` is not a well-formed safetensors file (header and tensor offsets against the
    file size), or None."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        prefix = fh.read(8)
        if len(prefix) < 8:
            return f"{size} bytes, shorter than the 8-byte header length"
        length = int.from_bytes(prefix, "little")
        if length > min(size - 8, _MAX_HEADER):
            return f"header length {length} does not fit in the file ({size} bytes): truncated or not safetensors"
        try:
            header = json.loads(fh.read(length))
        except (UnicodeDecodeError, ValueError):
            return "its header is not valid JSON"
    if not isinstance(header, dict):
        return "its header is not a JSON object"
    data = size - 8 - length
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            return f"tensor {name!r} has no valid data_offsets"
        end = max(end, offsets[1])
    if end != data:
        return f"its tensors span {end} bytes but the file holds {data} after the header (truncated or padded)"
    return None


def _damaged(path: Path, key: str, why: str) -> ModelPathError:
    return ModelPathError(f"{key}: weight file {path} is damaged: {why}. Copy it again, or re-save the model "
                          "with save_pretrained().")
