"""The ``simulate`` section: what ``gyre simulate`` assumes about the cluster and the task.

``gyre train`` ignores it. The rest of the config (batch shape, sampling, asynchrony, tail batching,
placement) is read as it is, so the simulation runs the same scheduler rules the run would; this section
says what the config cannot: the model size and device class planned for, and the shape of the task
(response lengths, rewards, environments). ``--calibrate metrics.jsonl`` fits the response lengths from
a real run instead.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from gyre.config.base import NonNegInt, PositiveInt, StrictModel
from gyre.config.catalog import DEVICES, MODELS

Fraction = Annotated[float, Field(gt=0, lt=1)]
NonNegFloat = Annotated[float, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]


class SimWorkloadConfig(StrictModel):
    """The simulated task: prompt and response lengths, pass rates, reward and environment latency."""

    prompt_tokens: PositiveFloat = 256.0
    """Mean prompt length in tokens."""
    prompt_tokens_cv: NonNegFloat = 0.3
    """Coefficient of variation of prompt lengths (lognormal)."""
    response_tokens: PositiveFloat = 1024.0
    """Mean response length in tokens before the cap (rollout.sampling.max_new_tokens cuts the tail)."""
    length_sigma: NonNegFloat = 0.9
    """Lognormal sigma of response lengths: 0.9 makes the longest of a thousand samples about 15x the
    median (RollPacker measured 25-32x on reasoning tasks)."""
    prompt_share: Annotated[float, Field(ge=0, le=1)] = 0.6
    """Share of the length's log-variance that is the prompt's (hard prompts' samples are long together);
    the rest varies per sample."""
    pass_rate: Fraction = 0.5
    """Mean chance a sample is correct (each prompt has its own; dynamic sampling's filter reads them)."""
    reward_latency_s: NonNegFloat = 0.5
    """Mean seconds one reward call takes (a sandbox run, a judge call)."""
    reward_latency_cv: NonNegFloat = 1.0
    """Coefficient of variation of reward latency (lognormal)."""
    turns: PositiveFloat = 4.0
    """Environment runs: mean turns per episode."""
    turns_cv: NonNegFloat = 0.5
    """Environment runs: coefficient of variation of the turn count."""
    turn_tokens: PositiveFloat = 256.0
    """Environment runs: mean tokens the model writes per turn (env.turn_tokens caps it)."""
    observation_tokens: PositiveFloat = 128.0
    """Environment runs: mean tokens of an observation."""
    env_latency_s: NonNegFloat = 1.0
    """Environment runs: mean seconds of one environment step."""
    env_latency_cv: NonNegFloat = 1.0
    """Environment runs: coefficient of variation of step latency (ROLL Flash's gain grows with it)."""
    reset_latency_s: NonNegFloat = 1.0
    """Environment runs: mean seconds of an environment reset."""
    env_failure_rate: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """Environment runs: chance an environment call fails (raises, its process dies) after its latency; the
    episode is replaced, its group given up after env.max_failures (as in a run)."""
    env_hang_rate: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """Environment runs: chance an environment call never answers: its slot is held until
    env.step_timeout_s (env.reset_timeout_s for a reset), then it fails (ROLL Flash's redundant environments
    are for these)."""


class SimElasticConfig(StrictModel):
    """Rollout engines that join and leave at run time, besides the layout's (ROSE's lent serving
    capacity, Spotlight's spot instances): each by an on/off process on the virtual clock."""

    lent: NonNegInt = 0
    """Engines that come and go (0: a fixed pool)."""
    on_s: PositiveFloat = 600.0
    """Mean seconds a lent engine stays once it joins (exponential)."""
    off_s: NonNegFloat = 600.0
    """Mean seconds it is away before it (or a replacement) joins again (exponential)."""
    warning_s: NonNegFloat | None = 0.0
    """Notice before an engine leaves: None, none (a spot instance killed: its samples are regenerated);
    0, it hands its samples' tokens back as it leaves and other engines continue them; above 0, it takes
    no new work for that long, decodes on, then hands back what is left."""


class SimPoolConfig(StrictModel):
    """Rollout engines on a device class of their own (RollArt's heterogeneous pools)."""

    device: str
    """The pool's device class (``gyre simulate --list-devices``)."""
    devices: PositiveInt
    """Devices in the pool: devices // rollout tensor parallelism engines."""

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        return known_device(value)


def known_device(value: str) -> str:
    if value.lower() not in DEVICES:
        raise ValueError(f"unknown device class {value!r}: one of {', '.join(sorted(DEVICES))}")
    return value.lower()


class SimulateConfig(StrictModel):
    """What ``gyre simulate`` plans for: devices, model size, device class and task shape."""

    devices: PositiveInt = 8
    """Devices of the simulated cluster (``gyre simulate --devices 8,64,1024`` sweeps it); with rollout_pools,
    the training devices."""
    device: str = "h100"
    """Device class of training, and of rollout unless rollout_pools gives it its own: h100, h800, h200, h20,
    a100, l40s, or cpu (this machine's 2 cores with the tiny model, calibrated). ``gyre simulate
    --list-devices`` shows their figures."""
    model: str = "7b"
    """The policy's size: 0.5b, 1.5b, 3b, 7b, 8b, 14b, 32b (Qwen2.5/Qwen3 shapes), or "config" for the
    config's own model.path (its config.json is read; nothing is loaded)."""
    rollout_tp: PositiveInt | None = None
    """Devices per rollout engine (tensor parallelism). None: rollout.tensor_parallel_size, the run's own."""
    rollout_pools: list[SimPoolConfig] = []
    """Rollout on pools of their own device classes (``[{device: h20, devices: 24}, {device: h800, devices:
    8}]``): then every one of ``devices`` (of class ``device``) trains, the engines of all pools decode side by
    side with it and take requests by the run's own rule (the least loaded first), the weights cross nodes,
    and the cost adds each pool's price. Empty: rollout and training share ``device`` by the config's
    placement. RollArt's affinity compares such pools at equal cost (bench/claims/rollart_affinity.yaml)."""
    env_price_per_hour: NonNegFloat = 0.0
    """Environment runs: what the environments' hosts cost an hour (CPU nodes, in the device prices' units),
    added to cost/1k samples; 0 when they run on the GPU hosts' CPUs (see env_latency_scale)."""
    rollout_share: Fraction | None = None
    """Share of the devices that run rollout when rollout and training are disaggregated. None: as in
    the config's device lists (rollout.devices against policy.devices), or 0.6 when they overlap but
    asynchrony asks for disjoint devices (ROLL Flash's 24 of 40)."""
    max_rows: PositiveInt | None = None
    """Most sequences an engine decodes at once. None: rollout.max_batch_size, else vLLM's default of 256
    for a vLLM engine, and for gyre's HF engine as many as its KV cache holds by its own rule (rows x the
    widest prompt + token budget). Either way the engine knows no sample's final length in advance: a vLLM
    engine admits what fits now and preempts the newest row when the growing rows outgrow its cache."""
    reward_workers: NonNegInt = 0
    """Reward calls that run at once; 0: as many as arrive (a serverless reward service)."""
    env_slots: PositiveInt | None = None
    """Environment runs: environments that run at once. None: env.workers x env.slots_per_worker."""
    env_latency_scale: PositiveFloat = 1.0
    """Environment runs: multiplies environment latency (above 1 when environments share busy GPU hosts'
    CPUs instead of running on CPU nodes)."""
    steps: PositiveInt = 8
    """Training steps simulated per setting."""
    warmup_steps: NonNegInt = 2
    """First steps left out of the averages (an asynchronous pipeline is still filling)."""
    seed: int = 0
    """Seeds the workload's draws (lengths, rewards, latencies): the same seed gives the same numbers."""
    workload: SimWorkloadConfig = SimWorkloadConfig()
    """The simulated task's shape."""
    elastic: SimElasticConfig = SimElasticConfig()
    """Rollout capacity that joins and leaves mid-run (ROSE, Spotlight); by default none."""

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        return known_device(value)

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value.lower() not in MODELS and value != "config":
            raise ValueError(f"unknown model size {value!r}: one of {', '.join(MODELS)}, or config (model.path's "
                             f"config.json)")
        return value.lower()
