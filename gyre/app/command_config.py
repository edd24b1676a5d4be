"""The run config ``gyre eval`` and ``gyre generate`` read their sections from.

They take the sections of a ``gyre train`` config (model settings, data and column mapping, reward,
validation, sampling), from the first of:

1. ``--config FILE``, the same YAML as ``gyre train`` takes;
2. the run's own ``resolved_config.yaml`` when the model is a run or one of its checkpoints (so
   ``gyre eval runs/grpo`` scores held-out prompts exactly as the run's validation did);
3. nothing (every section at its default);

then ``key.path=value`` overrides, then the command's flags (``--data``, ``--n``, ...), each a key of that
config. ``model.path`` is always the model the command was pointed at, already resolved.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gyre.app.model_source import ModelSource
from gyre.config.load import ConfigError, apply_override, read_yaml, set_key, validate_config
from gyre.config.schema import RLVRConfig


def command_config(source: ModelSource, config: str | None, overrides: Sequence[str],
                   flags: Mapping[str, Any], needs: str) -> RLVRConfig:
    """The validated config; ``flags`` maps dotted keys to the flags' values (None: not given); ``needs`` is
    the data key the command reads ("data.val_files" or "data.train_files"), which must end up set."""
    raw, origin = _base(source, config)
    if isinstance(raw.get("env"), dict):  # before the data check: such a config has no data to point at
        raise ConfigError(agentic_refusal(origin, raw["env"], needs))
    for item in overrides:
        apply_override(raw, item)
    for key, value in flags.items():
        if value is not None:
            set_key(raw, key, value)
    model = raw.get("model") if isinstance(raw.get("model"), dict) else {}
    raw["model"] = {**model, "path": str(source.base_model)}
    raw["model"].pop("revision", None)  # the source is resolved already
    if source.kind == "model" and source.run_config is not None:
        raw["model"].pop("tokenizer_path", None)  # a run's final model holds its tokenizer files
    data = raw.get("data")
    if not isinstance(data, dict) or not data.get(needs.partition(".")[2]):
        raise ConfigError(f"no prompts to read: give them with --data FILE (or set {needs} in --config, or as an "
                          f"override {needs}=[FILE]); files, directories, globs and {{dataset: ...}} entries work")
    data.setdefault("train_files", data.get("val_files"))
    if raw.get("env") is not None:  # set by an override
        raise ConfigError(agentic_refusal("an env.* override", raw["env"], needs))
    return validate_config(raw, source=origin)


def agentic_refusal(origin: str, env: Any, needs: str) -> str:
    """Why eval and generate do not take an agentic run's config, and what scores such a model instead."""
    env_id = env.get("id", "?") if isinstance(env, dict) else "?"
    if needs == "data.train_files":
        return (f"{origin} configures an environment (env: {env_id}), and gyre generate answers prompts from data "
                "files: give --config with a data section (a gyre train config) and --data FILE to answer prompts "
                "with this model")
    return (f"{origin} configures an environment (env: {env_id}): its model plays episodes against environment "
            "workers, which gyre eval does not start (it scores answers to prompts from data files). An agentic run "
            "is scored by its own validation: every validation.every steps, and before the first and after the "
            "last, it plays the env.val_episodes held-out seeds and logs val/* to metrics.jsonl and validation.md. "
            "To score a model on the environment, start a one-step run from it and read its step-0 validation "
            "(val/ at step 0 in its metrics.jsonl): gyre train CONFIG model.path=MODEL run.steps=1 validation.every=1 "
            "sft_warmup=null run.output_dir=runs/score (a checkpoint first becomes a model with gyre export RUN --step "
            "N --out DIR). To score it on prompts instead, give --config with a data section and --data FILE.")


def _base(source: ModelSource, config: str | None) -> tuple[dict, str]:
    """The raw sections to start from, and what to call them in messages."""
    if config is not None:
        return read_yaml(Path(config)), config
    run = source.run_config
    if run is None:
        return {}, "the command line"
    origin = str(source.run_dir / "resolved_config.yaml")
    if run.get("pipeline", "rlvr") != "rlvr":  # a standalone SFT run: only its model settings carry over
        return {"model": copy.deepcopy(run.get("model") or {})}, origin
    return copy.deepcopy(run), origin
