"""Typed, strict configuration schema for gyre runs.

Every key a run reads is a declared field here; unknown keys are rejected (see ``load.py`` for the
"did you mean" message). Defaults are neutral: KL is off, no reference model is created unless a KL
coefficient asks for one, and anything the loader derives from these fields is computed once in
``derive.py`` and printed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+))?\s*$")


def parse_devices(value: object) -> tuple[int, ...]:
    """Accept ``[0, 1]``, ``3`` or the declarative range syntax ``"0-3,6"`` (no ``eval``)."""
    if isinstance(value, bool):
        raise ValueError("a device list must be integers, not a boolean")
    if isinstance(value, int):
        items: list[int] = [value]
    elif isinstance(value, str):
        items = []
        for part in value.split(","):
            match = _RANGE.match(part)
            if not match:
                raise ValueError(f"cannot read device list {value!r}: use a list like [0, 1] or ranges like '0-3,6'")
            lo = int(match.group(1))
            hi = int(match.group(2)) if match.group(2) is not None else lo
            if hi < lo:
                raise ValueError(f"device range {part.strip()!r} runs backwards")
            items.extend(range(lo, hi + 1))
    elif isinstance(value, (list, tuple)):
        items = []
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int):
                raise ValueError(f"device {item!r} is not an integer index")
            items.append(item)
    else:
        raise ValueError(f"cannot read device list {value!r}")
    if not items:
        raise ValueError("a device list cannot be empty")
    if any(i < 0 for i in items):
        raise ValueError(f"device indices must be >= 0, got {items}")
    if len(set(items)) != len(items):
        raise ValueError(f"device list {items} names a device twice")
    return tuple(items)


DeviceList = Annotated[tuple[int, ...], BeforeValidator(parse_devices)]
PositiveInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
UnitFloat = Annotated[float, Field(ge=0, le=1)]


class StrictModel(BaseModel):
    """Base for every config section: unknown keys are errors, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunConfig(StrictModel):
    name: str = "gyre-run"
    output_dir: Path = Path("runs/gyre-run")
    seed: NonNegInt = 0
    steps: PositiveInt = 100
    """Number of RL training steps; each consumes one rollout batch."""


class ClusterConfig(StrictModel):
    address: str | None = None
    """Ray address of an existing cluster ("auto", "ray://host:10001"); None uses $RAY_ADDRESS, else an
    embedded local Ray is started."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Kind of device that role device lists index: "auto" is cuda when GPUs are visible, else cpu."""
    cpu_slots: PositiveInt | None = None
    """On CPU, how many device slots exist (each one CPU core); default: the machine's core count."""
    threads_per_slot: PositiveInt = 1
    """torch threads a worker gets per CPU slot it owns."""


class ModelConfig(StrictModel):
    path: str
    """A local Hugging Face model directory (config.json, weights, tokenizer files)."""
    tokenizer_path: str | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    trust_remote_code: bool = False
    gradient_checkpointing: bool = False


class DataConfig(StrictModel):
    train_files: list[str]
    """JSONL or Parquet files; each row has `prompt` (text) or `messages` (chat), `ground_truth`, optional `tag`."""
    val_files: list[str] = []
    max_prompt_tokens: PositiveInt = 512
    chat_template: Literal["auto", "always", "never"] = "auto"
    """auto: use the tokenizer's chat template when it has one; chat `messages` rows always need one."""
    shuffle: bool = True
    max_val_prompts: PositiveInt | None = None

    @field_validator("train_files")
    @classmethod
    def _non_empty(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("data.train_files must name at least one JSONL or Parquet file")
        return value


class SamplingConfig(StrictModel):
    temperature: Annotated[float, Field(ge=0)] = 1.0
    """0 means greedy decoding."""
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    top_k: NonNegInt = 0
    """0 disables top-k."""
    max_new_tokens: PositiveInt = 256
    stop: list[str] = []
    """Extra stop strings; generation also stops at the tokenizer's EOS."""


class RolloutConfig(StrictModel):
    devices: DeviceList = (0,)
    backend: Literal["hf"] = "hf"
    mode: Literal["separate", "hybrid"] = "separate"
    """separate: rollout engines are actors of their own holding a copy of the weights, synced after every
    step (what disaggregation needs). hybrid: every policy rank also samples, with its own training
    weights: nothing to transfer, one copy of the model per device. Hybrid needs rollout.devices equal to
    policy.devices and policy.strategy ddp (sampling from FSDP2 shards would gather weights every token)."""
    prompts_per_step: PositiveInt = 8
    samples_per_prompt: PositiveInt = 8
    max_batch_size: PositiveInt | None = None
    """Most sequences one engine decodes at once; None decodes a worker's whole share together."""
    sampling: SamplingConfig = SamplingConfig()


class OptimizerConfig(StrictModel):
    lr: PositiveFloat = 1e-5
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: PositiveFloat = 1e-8


class SchedulerConfig(StrictModel):
    type: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: NonNegInt = 0
    """Optimizer steps of linear warm-up from 0."""
    min_lr_ratio: UnitFloat = 0.0
    """For linear and cosine decay: the final learning rate as a fraction of the peak."""


class PolicyConfig(StrictModel):
    devices: DeviceList = (0,)
    strategy: Literal["ddp", "fsdp2"] = "ddp"
    optimizer: OptimizerConfig = OptimizerConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    grad_clip: PositiveFloat | None = 1.0
    mini_batch_size: PositiveInt | None = None
    """Samples per optimizer step, across all data-parallel ranks; None is the whole rollout batch."""
    micro_batch_size: PositiveInt = 8
    """Samples per forward/backward on one rank; gradients accumulate over micro-batches."""
    epochs: PositiveInt = 1
    """Passes over each rollout batch."""
    offload: Literal["auto", "always", "never"] = "auto"
    """Offload idle state of roles that share a device: auto offloads on GPU, never on CPU."""


class AlgorithmConfig(StrictModel):
    name: Literal["grpo"] = "grpo"
    clip_low: Annotated[float, Field(ge=0, lt=1)] = 0.2
    clip_high: Annotated[float, Field(ge=0)] = 0.2
    loss_agg: Literal["token-mean"] = "token-mean"
    kl_coef: Annotated[float, Field(ge=0)] = 0.0
    """Coefficient of the k3 KL-to-reference loss term; > 0 creates the reference role."""
    entropy_coef: Annotated[float, Field(ge=0)] = 0.0
    std_eps: PositiveFloat = 1e-6
    std_ddof: Literal[0, 1] = 1
    old_logprobs: Literal["auto", "recompute", "rollout"] = "auto"
    """Where pi_old comes from: recompute with the trainer, or the sampler's log-probs; auto recomputes
    when there is more than one optimizer step per rollout batch (else the detached current ones serve)."""


class ReferenceConfig(StrictModel):
    devices: DeviceList = (0,)
    micro_batch_size: PositiveInt = 16


class RewardConfig(StrictModel):
    type: Literal["math", "function"] = "math"
    function: str | None = None
    """For type "function": "package.module:function" or "path/to/file.py:function"."""
    kwargs: dict[str, object] = {}
    """Extra keyword arguments passed to the reward function."""
    timeout_s: PositiveFloat = 10.0
    processes: PositiveInt = 1
    """Worker processes the reward role evaluates samples in (isolation from hangs and crashes)."""

    @model_validator(mode="after")
    def _function_named(self) -> RewardConfig:
        if self.type == "function" and not self.function:
            raise ValueError('reward.type "function" needs reward.function: "module:function"')
        if self.function and ":" not in self.function:
            raise ValueError(f'reward.function {self.function!r} must look like "module:function"')
        return self


class ValidationConfig(StrictModel):
    every: NonNegInt = 0
    """Validate every this many steps (and before the first and after the last); 0 turns it off."""
    temperature: Annotated[float, Field(ge=0)] = 0.0
    samples_per_prompt: PositiveInt = 1


class CheckpointConfig(StrictModel):
    every: NonNegInt = 0
    """Save every this many steps; 0 saves only the final model."""
    keep_last: PositiveInt = 2


class LoggingConfig(StrictModel):
    tensorboard: bool = True
    plot: bool = True
    progress: bool = True


class SFTConfig(StrictModel):
    """Supervised warm-up before RL (or a standalone SFT run)."""

    train_files: list[str]
    """JSONL or Parquet rows with `prompt` or `messages`, and the target `response`."""
    steps: PositiveInt = 100
    batch_size: PositiveInt = 32
    """Samples per optimizer step across all ranks."""
    micro_batch_size: PositiveInt = 32
    optimizer: OptimizerConfig = OptimizerConfig(lr=1e-3)
    scheduler: SchedulerConfig = SchedulerConfig()
    grad_clip: PositiveFloat | None = 1.0
    max_tokens: PositiveInt = 1024


class RLVRConfig(StrictModel):
    """A full RLVR run: GRPO on verifiable rewards, optionally after an SFT warm-up."""

    pipeline: Literal["rlvr"] = "rlvr"
    run: RunConfig = RunConfig()
    cluster: ClusterConfig = ClusterConfig()
    model: ModelConfig
    data: DataConfig
    rollout: RolloutConfig = RolloutConfig()
    policy: PolicyConfig = PolicyConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    reference: ReferenceConfig = ReferenceConfig()
    reward: RewardConfig = RewardConfig()
    validation: ValidationConfig = ValidationConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    logging: LoggingConfig = LoggingConfig()
    sft_warmup: SFTConfig | None = None
