"""Typed, strict configuration schema for gyre runs.

Every key a run reads is a declared field here; unknown keys are rejected (see ``load.py`` for the
"did you mean" message). Defaults are neutral: KL is off, no reference model is created unless a KL
coefficient asks for one, and anything the loader derives from these fields is computed once in
``derive.py`` and printed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from gyre.config.algorithm_schema import AlgorithmConfig
from gyre.config.base import DeviceList, NonNegInt, PositiveFloat, PositiveInt, StrictModel
from gyre.config.data_schema import DataConfig
from gyre.config.elastic_schema import ElasticConfig
from gyre.config.env_schema import EnvConfig
from gyre.config.logging_schema import LoggingConfig
from gyre.config.presets import expand_preset_sections
from gyre.config.reward_schema import RewardConfig
from gyre.config.sim_schema import SimulateConfig
from gyre.config.train_schema import (  # noqa: F401 - the trainer sections, importable from here too
    CriticConfig,
    ForwardLevers,
    LoraConfig,
    OptimizerConfig,
    PolicyConfig,
    ReferenceConfig,
    SchedulerConfig,
    SFTConfig,
    TeacherConfig,
)


class RunConfig(StrictModel):
    name: str = "gyre-run"
    """The run's name (logs, TensorBoard, ablation labels)."""
    output_dir: Path = Path("runs/gyre-run")
    """Receives metrics, checkpoints and the final model; a directory that holds another run is refused
    unless --resume continues it or --overwrite moves it aside."""
    seed: NonNegInt = 0
    """Seeds prompt order, sampling, model init and every worker: a seeded run's metrics repeat exactly."""
    steps: PositiveInt = 100
    """Number of RL training steps; each consumes one rollout batch."""
    max_restarts: NonNegInt = 3
    """In-run recoveries: when a role's worker dies or hangs, the run rebuilds its roles, reloads the last
    checkpoint (one is saved before the first step) and continues, at most this many times; 0 stops at
    the first fault with the command that resumes."""


class WatchdogConfig(StrictModel):
    """Deadlines on every remote call to a role: a worker that stalls (stopped, deadlocked in a collective)
    is reported with its role, rank and what it was doing, and handled like one that died."""

    call_timeout_s: PositiveFloat = 3600.0
    """The longest any one call to a role may take (model loading and the first steps included)."""
    stall_factor: PositiveFloat = 20.0
    """Once a call has a history (three runs), it is declared hung after this many times its usual
    (median) duration..."""
    stall_min_s: PositiveFloat = 300.0
    """...but never sooner than this."""
    heartbeat_factor: PositiveFloat = 3.0
    """The progress line shows what the run waits on when a call takes this many times longer than usual."""


class ClusterConfig(StrictModel):
    address: str | None = None
    """Ray address of an existing cluster ("auto", "host:6379", "ray://host:10001"); None starts a private
    local Ray (never one found in $RAY_ADDRESS or a `ray start`)."""
    connect_timeout_s: PositiveFloat = 15.0
    """Seconds an existing cluster has to answer when joining it (Ray alone would retry for ever)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Kind of device that role device lists index: "auto" is cuda when GPUs are visible, else cpu."""
    cpu_slots: PositiveInt | None = None
    """On CPU, how many device slots exist (each one CPU core); default: the machine's core count."""
    threads_per_slot: PositiveInt = 1
    """torch threads a worker gets per CPU slot it owns."""
    device_memory_gb: PositiveFloat | None = None
    """Memory of one GPU, GB, for the memory pre-flight (gyre check refuses a plan whose estimate does not
    fit): needed where gyre cannot see the GPUs (planning a cluster run from another machine); None takes
    the local GPU's, and on a cluster or a CPU the estimate is printed without a verdict."""


class ModelConfig(StrictModel):
    """The policy's starting model. Every model path of a run (here, critic.model_path, a judge's or a
    reward model's) is a local Hugging Face model directory or a Hub id resolved, once and on the driver,
    to its snapshot in the local Hugging Face cache; nothing is downloaded during a run."""

    path: str
    """A local Hugging Face model directory (config.json, weights, tokenizer files), or a Hub id such as
    Qwen/Qwen2.5-0.5B-Instruct already in the local Hugging Face cache ($HF_HUB_CACHE, else $HF_HOME/hub,
    else ~/.cache/huggingface/hub; fetch it once with `hf download <id>`). A directory of that name wins."""
    revision: str | None = None
    """For a Hub id: the branch, tag or commit (a unique prefix of one) of the cached snapshot to load;
    None is main. It also applies to tokenizer_path and critic.model_path when they name the same id."""
    tokenizer_path: str | None = None
    """Where the tokenizer comes from (a directory or a cached Hub id, as path); default: path. Its files
    are copied unchanged into the saved final model."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """The compute precision, TRL's torch_dtype: the rollout engines, the reference model and local judges
    hold their weights in it; the trainers keep float32 master weights and, on GPUs, compute in it under
    autocast (FSDP2: its mixed-precision policy). auto: bfloat16 on GPUs, float32 on CPU (resolved once at
    start and printed). It does not set the dtype of the saved model (save_dtype does)."""
    save_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """The dtype the final model is saved in; auto is the dtype the input model is stored in (its
    config.json, else its weights), resolved once at start and printed."""
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2", "flash_attention_3",
                                 "flex_attention"] | None = None
    """The attention kernel of the policy, rollout, reference and critic models (transformers'
    attn_implementation); None lets transformers choose (sdpa where the model supports it), except for the
    trainers and reference models whose micro-batches are packed on GPUs (remove_padding: pack), which
    get flash_attention_2 where flash-attn imports, else flex_attention (a hybrid rollout's policy: sdpa),
    so packing never pays sdpa's dense N x N mask. The flash_attention kinds need CUDA GPUs and the
    flash-attn package; flex_attention trains only on CUDA GPUs."""
    trust_remote_code: bool = False
    """Run the modelling and tokenizer code shipped with the model (transformers' trust_remote_code)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass of the trainers: less memory, about a third more compute."""


class SamplingConfig(StrictModel):
    temperature: Annotated[float, Field(ge=0)] = 1.0
    """0 means greedy decoding."""
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Nucleus sampling: the smallest set of tokens whose probability reaches top_p; 1 disables it."""
    top_k: NonNegInt = 0
    """0 disables top-k."""
    max_new_tokens: PositiveInt = 256
    """The longest response in tokens; a response cut here is truncated (and can be masked or penalised)."""
    stop: list[str] = []
    """Extra stop strings; generation also stops at the tokenizer's EOS."""


class DynamicSamplingConfig(StrictModel):
    """Committed groups that teach nothing are dropped and replaced by newly admitted prompts until the
    batch is full (DAPO). Counted per step: rollout/groups_filtered, rollout/groups_admitted."""

    min_std: Annotated[float, Field(ge=0)] | None = 0.0
    """Drop groups whose reward std (population) is at or below this (0: all samples scored the same)."""
    mean_range: tuple[float, float] | None = None
    """Keep only groups whose mean reward lies strictly inside (low, high), e.g. [0, 1] for accuracy."""
    max_draws: Annotated[float, Field(ge=1)] = 3.0
    """Most groups admitted for one step, as a multiple of prompts_per_step; when they run out, dropped
    groups complete the batch (rollout/filter_fallback counts them)."""


class TailBatchingConfig(StrictModel):
    """RollPacker: short rounds launch eta_prompts x P prompts with eta_samples x R samples each and keep the
    first R samples of the first P prompts to complete; cut prompts wait in a long queue and run, P at a
    time, in a long round to completion. Every prompt still trains exactly once."""

    eta_prompts: Annotated[float, Field(ge=1)] = 1.25
    """Prompts a short round launches, as a multiple of prompts_per_step (RollPacker recommends 1.25)."""
    eta_samples: Annotated[float, Field(ge=1)] = 1.25
    """Samples each prompt of a short round asks for, as a multiple of samples_per_prompt."""


class RolloutConfig(StrictModel):
    devices: DeviceList = (0,)
    """Devices (GPU indices, or CPU slots) of the rollout engines: one engine per device, or per
    tensor_parallel_size consecutive devices."""
    tensor_parallel_size: PositiveInt = 1
    """GPUs one rollout engine spans (vLLM tensor parallelism: each layer's weights and KV cache split over
    them), for a model one GPU cannot hold or serve fast enough: rollout.devices then form
    len(devices) / tensor_parallel_size engines of consecutive devices (``gyre check`` prints them).
    Above 1 it needs rollout.backend=vllm, GPUs, and rollout devices no other role uses (colocated
    tensor parallelism is not supported)."""
    backend: Literal["hf", "vllm"] = "hf"
    """The inference engine of the rollout actors: hf, gyre's continuously batching Hugging Face engine
    (built in); vllm, vLLM 0.32 in each rollout actor's own process (install: docs/guides/engines.md;
    rollout.mode separate). Judges and hybrid rollout use the hf engine."""
    weight_transport: Literal["auto", "channel", "object_store"] = "auto"
    """How new weights reach separate rollout engines after each step. channel: the policy's rank 0 stages
    them on its device in model.dtype and broadcasts them to every engine over a process group of their own
    (NCCL between GPUs, gloo on CPU), each engine copying into its weights in place; object_store: through
    host memory and Ray's object store (always works, slower). auto: channel, except where NCCL cannot
    join the ranks (an engine on the policy's rank-0 GPU). A channel that loses a member sends that version
    through the object store and is rebuilt for the next."""
    weight_sync_timeout_s: PositiveFloat = 600.0
    """Deadline of one weight transfer on the channel (and of building its group)."""
    mode: Literal["separate", "hybrid"] = "separate"
    """separate: rollout engines are actors of their own holding a copy of the weights, synced after every
    step (what disaggregation needs). hybrid: every policy rank also samples, with its own training
    weights: nothing to transfer between roles. Hybrid needs rollout.devices equal to policy.devices. DDP
    ranks sample from their replica; FSDP2 ranks gather a full copy in the compute dtype after each step
    (on their own device, over the policy's process group) and sample from it."""
    prompts_per_step: PositiveInt = 8
    """Groups (prompts) in each training batch (P)."""
    samples_per_prompt: PositiveInt = 8
    """Samples in each group (R): group baselines are taken over them."""
    max_batch_size: PositiveInt | None = None
    """Most sequences one engine decodes at once (more requests queue and join as rows finish); None
    decodes everything it is given together."""
    max_batch_tokens: PositiveInt | None = None
    """The HF engine's KV-cache budget in tokens: rows join while rows x the longest row's final length
    (prompt + rollout.sampling.max_new_tokens: the cache is padded to the widest row) stays within it, the
    rest queue (a row alone always runs). gyre check's memory estimate uses it. vLLM pages its cache within
    its share of the GPU instead. None: no budget (max_batch_size, or everything given, decodes at once)."""
    max_prefill_tokens: PositiveInt | None = None
    """Tokens one prefill pass may hold (the HF engine: distinct prompts x the longest; vLLM:
    max_num_batched_tokens): rows joining at once, and every row after a weight update, are prefilled in
    chunks of it, so a prefill's activations stay bounded. None: all at once (vLLM: its default)."""
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] | None = None
    """On GPUs, the share of its device's memory a rollout engine's process may fill with weights and KV
    cache. vLLM: its gpu_memory_utilization (None: 0.9); the HF engine: its KV budget is what the share
    leaves beside the weights already there (and a hybrid rank's training state), in tokens, or
    max_batch_tokens where smaller (None: no budget from memory). Ignored on CPU."""
    emit_every: PositiveInt = 8
    """Finished samples an engine hands back together (or 50 ms after the first), so rewards start on
    early finishers while the rest decode, in calls big enough to be cheap."""
    schedule: Literal["sync", "queue"] = "sync"
    """sync: a step admits its prompts at once and a prompt's samples share one request on one engine
    (its prompt is prefilled once). queue: each sample is its own request, sent to the least-loaded
    engine (prompt replication: a long-tailed prompt does not pin one engine). async_ratio > 0 queues."""
    async_ratio: Annotated[float, Field(ge=0)] = 0.0
    """alpha of ROLL Flash: at step n no sample trains whose generation started before policy version
    n - 1 - ceil(alpha); for fractional alpha only frac(alpha) of the batch may be that old. 0 is
    synchronous. Above 0, rollout runs on its own devices while the policy trains (disjoint devices)."""
    async_mode: Literal["window", "lockstep"] = "window"
    """How asynchrony (async_ratio > 0) decides which version generates each group. window (ROLL Flash):
    engines admit groups as soon as capacity frees, under whatever version they hold, keeping several
    future batches in flight while a long tail decodes (the gain at scale), but timing decides the
    versions, so a run is reproducible only in distribution. lockstep: step n's batch
    is generated by version n - 1 - ceil(alpha) (frac(alpha) of it) and n - 1 - floor(alpha) (the rest),
    and an engine finishes its version's groups before it loads the next: the same seed gives the same
    run, and a resumed run continues its metric stream exactly; one batch per version, so each step
    waits for a batch's longest sample. Lockstep excludes redundancy; partial rollouts do not arise (no
    request spans a weight update)."""
    expired: Literal["requeue", "drop"] = "requeue"
    """A group that falls out of the staleness window before it trains (an engine stalled, a long tail
    outlived the bound; admission never plans one): requeue puts its prompt back at the head of the queue,
    generated again under fresher weights, so every prompt of the data order trains exactly once; drop
    loses it (counted in rollout/groups_dropped). Either way its tokens count in rollout/tokens_wasted."""
    partial: bool = True
    """Requests in flight at a weight update keep their tokens and continue under the new weights (each
    token records its version); false regenerates them from scratch (their tokens are wasted)."""
    redundancy: NonNegInt = 0
    """Extra prompts in flight per step; the first prompts_per_step groups to complete train, the rest are
    aborted (counted in rollout/groups_redundant)."""
    dynamic_sampling: DynamicSamplingConfig | None = None
    """DAPO's dynamic sampling (drop and refill); ``{}`` turns it on with its defaults."""
    tail_batching: TailBatchingConfig | None = None
    """RollPacker's tail batching (short rounds with speculation, long rounds for cut prompts); ``{}``
    turns it on with eta 1.25 for both."""
    sampling: SamplingConfig = SamplingConfig()
    """Temperature, top-p/top-k, length and stop strings of training samples."""
    elastic: ElasticConfig | None = None
    """Rollout engines lent to the run and taken back while it trains, on top of rollout.devices' base pool
    (a schedule by step, or an operator's controller: ``gyre.config.elastic_schema``); None: a fixed pool."""

    @property
    def replicate(self) -> bool:
        """Each sample its own request (queue scheduling, always with asynchrony)."""
        return self.schedule == "queue" or self.async_ratio > 0


class ValidationConfig(StrictModel):
    every: NonNegInt | None = None
    """Validate every this many steps (and before the first and after the last); 0 turns it off. Unset: on
    when data.val_files are given (every ceil(run.steps / 10) steps: about ten validations), else off."""
    temperature: Annotated[float, Field(ge=0)] = 0.0
    """Sampling temperature of validation; 0 is greedy."""
    samples_per_prompt: PositiveInt = 1
    """Samples per validation prompt (accuracy is their mean: mean@k)."""


class CheckpointConfig(StrictModel):
    every: NonNegInt = 0
    """Save every this many steps; 0 saves only the final model."""
    keep_last: PositiveInt = 2
    """Checkpoints kept; older ones are deleted as new ones are saved (the run's own, never a user's)."""


class RLVRConfig(StrictModel):
    """A full RLVR run: RL on verifiable rewards with the configured algorithm, optionally after an SFT warm-up."""

    pipeline: Literal["rlvr"] = "rlvr"
    """Which pipeline this config is for (RL: rlvr, with data or an environment)."""
    run: RunConfig = RunConfig()
    """Name, output directory, seed, steps and in-run recovery."""
    cluster: ClusterConfig = ClusterConfig()
    """The Ray cluster: an embedded local one, or an existing one by address."""
    watchdog: WatchdogConfig = WatchdogConfig()
    """Deadlines on every remote call to a role."""
    model: ModelConfig
    """The policy's model and tokenizer."""
    data: DataConfig | None = None
    """Prompts and answers (RLVR); a run has this or ``env``."""
    env: EnvConfig | None = None
    """An environment to act in (agentic RL); a run has this or ``data``."""
    rollout: RolloutConfig = RolloutConfig()
    """The rollout engines and the scheduler: batch shape, sampling, asynchrony, filters."""
    policy: PolicyConfig = PolicyConfig()
    """The policy trainer: devices, strategy, optimizer, mini-batches, LoRA, memory levers."""
    algorithm: AlgorithmConfig = AlgorithmConfig()
    """Advantage estimation, policy loss, KL, masks, the critic's training, distillation, mismatch correction
    and attention credit, one sub-section each (or a preset that fills them)."""
    reference: ReferenceConfig = ReferenceConfig()
    """The KL reference model's placement (used only when a KL term asks for it)."""
    teacher: TeacherConfig = TeacherConfig()
    """The teacher model of on-policy distillation (used only when algorithm.distill.coef > 0)."""
    critic: CriticConfig = CriticConfig()
    """The value model's placement and optimizer (used only by critic estimators such as gae)."""
    reward: RewardConfig = RewardConfig()
    """How responses are scored: one domain, or several routed by prompt tag."""
    validation: ValidationConfig = ValidationConfig()
    """Held-out evaluation during the run."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """How often to checkpoint and how many to keep."""
    logging: LoggingConfig = LoggingConfig()
    """Experiment trackers, generation samples, the metrics plot and the progress line."""
    sft_warmup: SFTConfig | None = None
    """Supervised steps before RL (teaches the answer format); None: RL from the start."""
    simulate: SimulateConfig = SimulateConfig()
    """What ``gyre simulate`` plans for (devices, model size, device class, task shape); training ignores it."""

    @model_validator(mode="before")
    @classmethod
    def _preset_sections(cls, data: object) -> object:
        return expand_preset_sections(data)

    @model_validator(mode="after")
    def _one_source(self) -> RLVRConfig:
        if (self.data is None) == (self.env is None):
            raise ValueError("a run learns from prompts (data: {train_files: [...]}) or from an environment "
                             "(env: {id: ...}): give exactly one of them")
        return self

    @model_validator(mode="after")
    def _validation_default(self) -> RLVRConfig:
        if self.validation.every is None:  # held-out prompts given are meant to be scored
            held_out = self.data is not None and bool(self.data.val_files)
            self.validation.every = -(-self.run.steps // 10) if held_out else 0
        return self

    @model_validator(mode="after")
    def _warmup_template(self) -> RLVRConfig:
        sft = self.sft_warmup
        if sft is not None and (sft.system_prompt is not None or sft.chat_template_kwargs):
            raise ValueError("sft_warmup renders its prompts like the RL prompts: set data.system_prompt and "
                             "data.chat_template_kwargs instead of sft_warmup.system_prompt / chat_template_kwargs")
        return self
