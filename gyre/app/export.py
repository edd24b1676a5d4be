"""``gyre export``: any checkpoint of a run (or any model) as a Hugging Face model directory.

A checkpoint's ``policy/`` is what the trainer ranks saved with ``torch.distributed.checkpoint``: the
model and optimizer state, sharded per rank under FSDP2. Only the model's tensors are read, into whole
(unsharded) tensors in this process, without a process group; the architecture (config.json, generation
config) and the tokenizer files come from the run's model, and the weights are written in the dtype
asked for (default: the dtype the run's model is stored in, as the run's final model).

The export is written beside the target and moved into place when complete, so an interrupted export
leaves no half-written model; an existing target is replaced only with ``overwrite``, and only when it
is a model directory (never an arbitrary directory a typo pointed at).

LoRA: a policy trained with an adapter checkpoints only the adapter's tensors (``gyre.models.lora``
marks such a checkpoint); ``write_hf_directory`` merges them into the base weights (a plain model
directory) or writes them as a PEFT adapter directory (``ExportSpec.merge_adapter``).
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gyre.app.model_source import ModelSource


class ExportError(ValueError):
    """The export target cannot be written as asked; the message says what to change."""


@dataclass(frozen=True)
class ExportSpec:
    """Where and how ``export_model`` writes."""

    out: Path
    """The Hugging Face model directory to write."""
    dtype: str | None = None
    """float32, bfloat16 or float16; None keeps the dtype the model (a checkpoint: its run's model) is stored in."""
    overwrite: bool = False
    """Replace ``out`` when it already holds a model directory."""
    merge_adapter: bool = True
    """A LoRA checkpoint: merge the adapter into the base model's weights; else write the adapter alone."""


def export_model(source: ModelSource, spec: ExportSpec, echo: Callable[[str], None] = print) -> Path:
    """Write ``source`` as a Hugging Face model directory at ``spec.out``; returns it."""
    out = Path(spec.out).expanduser().resolve()
    check_target(out, spec.overwrite, source)
    dtype = spec.dtype or source.stored_dtype()
    staging = out.with_name(f".{out.name}.partial-{os.getpid()}")
    staging.mkdir(parents=True)
    try:
        write_hf_directory(source, staging, dtype, spec.merge_adapter)
        _move_into_place(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    echo(f"exported {source.label} to {out} ({dtype})")
    return out


def check_target(out: Path, overwrite: bool, source: ModelSource) -> None:
    """Refuse a target that would lose data: anything existing without ``overwrite``, and with it anything
    but a model directory (or the source itself)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ExportError(f"{out} is a file; choose a directory path for --out")
    if not any(out.iterdir()):
        return
    if not overwrite:
        raise ExportError(f"{out} already exists and is not empty; add --overwrite to replace the model there, or "
                          "choose another --out")
    if out in (source.path, source.path.resolve()):
        raise ExportError(f"--out {out} is the model being exported; choose another directory")
    if not (out / "config.json").is_file():
        raise ExportError(f"{out} holds files but no model (no config.json): --overwrite replaces only a model "
                          "directory; choose another --out")


def _move_into_place(staging: Path, out: Path) -> None:
    """``staging`` becomes ``out``; an old model there is removed only once the new one is in place."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.replaced-{os.getpid()}")
        os.replace(out, old)
    os.replace(staging, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_hf_directory(source: ModelSource, directory: Path, dtype: str, merge_adapter: bool = True) -> None:
    """The weights of ``source`` in ``dtype``, its config and its tokenizer files, into ``directory`` (a LoRA
    checkpoint: merged into its base model, or as the adapter alone)."""
    from gyre.models.loading import load_causal_lm
    from gyre.models.lora import export_lora, read_marker
    from gyre.models.saving import save_hf_model

    _check_remote_code(source)
    if source.kind == "checkpoint" and read_marker(source.path / "policy") is not None:
        export_lora(source.path, source.base_model, directory, merge=merge_adapter, dtype=dtype,
                    tokenizer_path=source.tokenizer_dir, trust_remote_code=source.trust_remote_code, overwrite=True)
        return
    if source.kind == "checkpoint":
        model = _skeleton(source.base_model, source.trust_remote_code)
        state = read_policy_weights(source.path / "policy")
    else:
        model = load_causal_lm(source.path, "float32", source.trust_remote_code)
        state = model.state_dict()
    save_hf_model(model, state, directory, dtype, source.tokenizer_dir)


def _check_remote_code(source: ModelSource) -> None:
    """A model whose architecture is its own code loads only when the user allows that code to run."""
    from gyre.models.checks import custom_code_files

    files = custom_code_files(source.base_model)
    if files and not source.trust_remote_code:
        raise ExportError(f"the model {source.base_model} defines its architecture in its own code "
                          f"({', '.join(files)}, named by auto_map in its config.json), which runs when it loads: add "
                          "--trust-remote-code if you trust that code")


def read_policy_weights(directory: Path) -> dict:
    """The model tensors of a trainer checkpoint (``TrainerBackend.save``), whole and on the CPU, by their
    Hugging Face names; the optimizer state is not read. Shards of any number of ranks are consolidated."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from gyre.app.model_source import SourceError

    reader = dcp.FileSystemReader(str(directory))
    try:
        metadata = reader.read_metadata()
    except (OSError, ValueError, RuntimeError) as exc:
        raise SourceError(f"cannot read the trainer checkpoint in {directory} ({type(exc).__name__}: {exc}); "
                          "export another checkpoint of the run") from None
    # DCP flattens the saved {"model": ..., "optim": ...} into "model.<name>" keys.
    model = {key.removeprefix("model."): torch.empty(meta.size, dtype=meta.properties.dtype)
             for key, meta in metadata.state_dict_metadata.items()
             if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)}
    if not model:
        raise SourceError(f"the checkpoint in {directory} holds no model tensors")
    with warnings.catch_warnings():  # reading in one process, without a process group, is the intent
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load({"model": model}, storage_reader=reader, no_dist=True)
    return model


def _skeleton(base: Path, trust_remote_code: bool):
    """The base model's architecture and generation config, without weights (meta tensors)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from gyre.models.loading import quiet_transformers

    quiet_transformers()
    config = AutoConfig.from_pretrained(str(base), trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    if (base / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(str(base))
    return model


@contextmanager
def loadable_model(source: ModelSource) -> Iterator[Path]:
    """A Hugging Face model directory holding ``source``: the directory itself, or a checkpoint written out
    (in its run's stored dtype) to a temporary directory in the run's output directory, removed afterwards."""
    if source.kind == "model":
        yield source.path
        return
    staging = source.run_dir / f".export-step_{source.step}-{os.getpid()}"
    staging.mkdir()
    try:
        write_hf_directory(source, staging, source.stored_dtype())
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)
