"""What ``gyre eval``, ``gyre export`` and ``gyre generate`` are pointed at, resolved once.

A model is given as a Hugging Face model directory, a Hub id in the local cache, or a run's output:

- the run's output directory: its final model when the run finished, else its latest checkpoint;
- ``<run>/checkpoints``: the latest checkpoint; ``<run>/checkpoints/step_000040``: that one;
- ``<run>/final_model``: a model directory like any other;
- with ``--step N``, checkpoint N of the run.

A checkpoint is the trainer's state (weights sharded per rank, optimizer, LR schedule), not a model
directory: the architecture and tokenizer come from the run's model, named in its
``resolved_config.yaml``, and ``gyre.app.export`` consolidates the weights.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gyre.models.checks import ModelPathError

_STEP_DIR = re.compile(r"^step_(\d+)(\.tmp)?$")


class SourceError(ModelPathError):
    """The model, run or checkpoint a command was pointed at cannot be used; the message says why."""


@dataclass(frozen=True)
class ModelSource:
    """A model a command reads, resolved to a local path."""

    kind: Literal["model", "checkpoint"]
    path: Path
    """kind "model": the Hugging Face model directory; "checkpoint": the checkpoint's step directory."""
    label: str
    """How messages name it ("runs/grpo checkpoint step 40")."""
    run_dir: Path | None = None
    """The run it belongs to (checkpoints, and a run's final model)."""
    step: int | None = None
    """The checkpoint's step."""
    run_config: dict | None = None
    """The run's ``resolved_config.yaml`` (raw): its model, and the data and reward sections eval reuses."""
    remote_code: bool = False
    """The user allows the model's own code to run (``--trust-remote-code``), whatever its run said."""

    @property
    def base_model(self) -> Path:
        """The directory whose config.json gives the architecture: the model itself, or a checkpoint's run's."""
        if self.kind == "model":
            return self.path
        return Path(self._run_model()["path"])

    @property
    def tokenizer_dir(self) -> Path:
        """Where the tokenizer files are (copied unchanged into whatever is written from this source)."""
        if self.kind == "model":
            return self.path
        model = self._run_model()
        return Path(model.get("tokenizer_path") or model["path"])

    @property
    def trust_remote_code(self) -> bool:
        """Load with the model's own code: asked for on the command line, or by the run's model.trust_remote_code."""
        run = bool(self.run_config and (self.run_config.get("model") or {}).get("trust_remote_code"))
        return self.remote_code or run

    def stored_dtype(self) -> str:
        """The dtype the model is stored in: a checkpoint's run saves its final model in model.save_dtype."""
        from gyre.models.saving import stored_dtype

        if self.kind == "checkpoint":
            saved = self._run_model().get("save_dtype")
            if saved in ("float32", "bfloat16", "float16"):
                return saved
        return stored_dtype(self.base_model) or "float32"

    def _run_model(self) -> dict:
        model = (self.run_config or {}).get("model") or {}
        if not model.get("path"):
            raise SourceError(f"{self.label}: the run's resolved_config.yaml names no model.path, so the "
                              "checkpoint's architecture is unknown")
        return model


def resolve_source(text: str, step: int | None = None, revision: str | None = None) -> ModelSource:
    """The model ``text`` names (see the module docstring); ``step`` picks a checkpoint of a run; ``revision``
    a Hub id's cached revision. Raises SourceError saying what was found instead."""
    from gyre.models.hub import looks_like_hub_id, resolve_model_path

    path = Path(text).expanduser()
    if not path.exists():
        if step is not None:
            raise SourceError(f"--step {step}: {text} does not exist (give the run's output directory)")
        if looks_like_hub_id(text):
            return ModelSource("model", Path(resolve_model_path(text, revision, "MODEL")), text)
        raise SourceError(f"{text} does not exist. Give a Hugging Face model directory, a Hub id in the local cache, "
                          "a run's output directory (run.output_dir) or one of its checkpoints/step_N directories.")
    path = path.resolve()
    if revision is not None:
        raise SourceError(f"--revision {revision} selects a snapshot of a Hub id; {text} is a local path")
    if step is not None:
        return _checkpoint_of(_run_of(path, text), step)
    return _local(path, text)


def _local(path: Path, text: str) -> ModelSource:
    match = _STEP_DIR.match(path.name)
    if match and match.group(2):
        raise SourceError(f"{text} is an incomplete checkpoint (a run stopped while writing it); use a complete "
                          f"one: {_available(path.parent.parent)}")
    if match and path.parent.name == "checkpoints":
        return _checkpoint(path.parent.parent, path)
    if path.name == "checkpoints" and _is_run(path.parent):
        return _latest(path.parent, text)
    if (path / "config.json").is_file():
        run = path.parent if path.name == "final_model" and _is_run(path.parent) else None
        return ModelSource("model", path, text, run_dir=run, run_config=_run_config(run) if run else None)
    if _is_run(path):
        final = path / "final_model"
        if (final / "config.json").is_file():
            return ModelSource("model", final, f"{text} (final model)", run_dir=path, run_config=_run_config(path))
        return _latest(path, text)
    raise SourceError(f"{text} is neither a Hugging Face model directory (no config.json), nor a run's output "
                      "directory, nor a checkpoint (checkpoints/step_N with driver.json).")


def _is_run(path: Path) -> bool:
    return any((path / name).exists() for name in ("resolved_config.yaml", "run.json", "checkpoints"))


def _run_of(path: Path, text: str) -> Path:
    if path.name == "checkpoints" and _is_run(path.parent):
        return path.parent
    if _is_run(path):
        return path
    raise SourceError(f"--step picks a checkpoint of a run, and {text} is not a run's output directory (no "
                      "resolved_config.yaml, run.json or checkpoints/ in it)")


def _latest(run: Path, text: str) -> ModelSource:
    from gyre.training.checkpoint import CheckpointManager

    latest = CheckpointManager(run).latest()
    if latest is None:
        raise SourceError(f"{text}: the run there has neither a final model (it did not finish) nor a complete "
                          "checkpoint (checkpoint.every is 0, or it stopped before the first save)")
    return _checkpoint(run, latest)


def _checkpoint_of(run: Path, step: int) -> ModelSource:
    path = run / "checkpoints" / f"step_{step:06d}"
    if not (path / "driver.json").is_file():
        raise SourceError(f"--step {step}: {run} has no complete checkpoint of step {step}; {_available(run)}")
    return _checkpoint(run, path)


def _checkpoint(run: Path, path: Path) -> ModelSource:
    if not (path / "driver.json").is_file() or not (path / "policy").is_dir():
        raise SourceError(f"{path} is not a complete checkpoint (driver.json and policy/ are missing); "
                          f"{_available(run)}")
    step = int(_STEP_DIR.match(path.name).group(1))
    config = _run_config(run)
    if config is None:
        raise SourceError(f"cannot tell which model checkpoint {path} trains: {run / 'resolved_config.yaml'} (which "
                          "names it) is missing. Put the run's resolved_config.yaml back in its output directory.")
    source = ModelSource("checkpoint", path, f"{run} checkpoint step {step}", run, step, config)
    base = source.base_model
    if not (base / "config.json").is_file():
        raise SourceError(f"{source.label}: the run's model {base} (model.path in {run / 'resolved_config.yaml'}) is "
                          "gone, and it holds the architecture and tokenizer the checkpoint needs; put it back there")
    return source


def _run_config(run: Path) -> dict | None:
    import yaml

    path = run / "resolved_config.yaml"
    if not path.is_file():
        return None
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise SourceError(f"cannot read {path}: {exc}") from None
    return config if isinstance(config, dict) else None


def _available(run: Path) -> str:
    from gyre.training.checkpoint import CheckpointManager

    steps = [str(step) for step, _ in CheckpointManager(run).complete()]
    return f"complete checkpoints: steps {', '.join(steps)}" if steps else "the run has no complete checkpoint"
