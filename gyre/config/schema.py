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

from gyre.algos.advantages import ESTIMATORS, AdvantageEstimator
from gyre.algos.agentic import TurnSpec
from gyre.algos.attention_credit import CreditSpec
from gyre.algos.distill import DistillMode
from gyre.algos.mismatch import DIVERGENCE_LEVELS, DIVERGENCES
from gyre.algos.policy_loss import POLICY_LOSSES, OldSource, PolicyLossSpec, PolicyLossVariant
from gyre.config.base import (
    DeviceList,
    NonNegInt,
    PositiveFloat,
    PositiveInt,
    StrictModel,
    UnitFloat,
    section_from_spec,
)
from gyre.config.data_schema import DataConfig
from gyre.config.env_schema import EnvConfig
from gyre.config.logging_schema import LoggingConfig
from gyre.config.presets import algorithm_problems, expand_preset, expand_preset_sections
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
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """The compute precision, TRL's torch_dtype: the rollout engines and the reference model hold their
    weights in it; the trainers keep float32 master weights and, on GPUs, compute in it under autocast
    (FSDP2: its mixed-precision policy). It does not set the dtype of the saved model (save_dtype does)."""
    save_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """The dtype the final model is saved in; auto is the dtype the input model is stored in (its
    config.json, else its weights), resolved once at start and printed."""
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2", "flash_attention_3",
                                 "flex_attention"] | None = None
    """The attention kernel of the policy, rollout, reference and critic models (transformers'
    attn_implementation); None lets transformers choose (sdpa where the model supports it). The
    flash_attention kinds need CUDA GPUs and the flash-attn package."""
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
    """Devices (GPU indices, or CPU slots) of the rollout engines: one engine per device."""
    backend: Literal["hf"] = "hf"
    """The inference engine: gyre's continuously batching Hugging Face engine."""
    mode: Literal["separate", "hybrid"] = "separate"
    """separate: rollout engines are actors of their own holding a copy of the weights, synced after every
    step (what disaggregation needs). hybrid: every policy rank also samples, with its own training
    weights: nothing to transfer, one copy of the model per device. Hybrid needs rollout.devices equal to
    policy.devices and policy.strategy ddp (sampling from FSDP2 shards would gather weights every token)."""
    prompts_per_step: PositiveInt = 8
    """Groups (prompts) in each training batch (P)."""
    samples_per_prompt: PositiveInt = 8
    """Samples in each group (R): group baselines are taken over them."""
    max_batch_size: PositiveInt | None = None
    """Most sequences one engine decodes at once (more requests queue and join as rows finish); None
    decodes everything it is given together."""
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
    engines admit groups as soon as capacity frees, under whatever version they hold: the fastest, but
    timing decides the versions, so a run is reproducible only in distribution. lockstep: step n's batch
    is generated by version n - 1 - ceil(alpha) (frac(alpha) of it) and n - 1 - floor(alpha) (the rest),
    and an engine finishes its version's groups before it loads the next: the same seed gives the same
    run, and a resumed run continues its metric stream exactly. Lockstep excludes redundancy; partial
    rollouts do not arise (no request spans a weight update)."""
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

    @property
    def replicate(self) -> bool:
        """Each sample its own request (queue scheduling, always with asynchrony)."""
        return self.schedule == "queue" or self.async_ratio > 0


NormScope = Literal["none", "group", "batch", "running"]
Level = Literal["none", "token", "segment", "geometric", "sequence"]


class MismatchConfig(StrictModel):
    """Train-inference mismatch correction (ROLL ``train_infer_correction``): the trainer's pi_old against
    the sampler's log-probs mu. Needs recomputed old log-probs (the plan turns recomputation on).

    Every ratio here is pi_old / mu, the trainer's probability over the sampler's (log-ratio
    log pi_old - log mu), as in ROLL and verl's rollout_is. Some frameworks bound the inverse: verl's k1
    rejection (rollout_rs token_k1, seq_sum_k1, seq_mean_k1 with a "lo_hi" threshold) keeps
    lo <= mu / pi_old <= hi, which is ratio_low = 1 / hi, ratio_high = 1 / lo here."""

    weight: Level = "none"
    """Importance weight pi_old / mu multiplying each token's loss, at this granularity; none turns it off."""
    upper_bound: PositiveFloat = 1.2
    """The weight pi_old / mu is truncated at this value (verl's rollout_is_threshold, same direction)."""
    filter: Level = "none"
    """Drop tokens / segments / sequences whose ratio pi_old / mu (at this granularity) leaves
    [ratio_low, ratio_high] (k1 rejection: the log-ratio log pi_old - log mu outside [ln low, ln high])."""
    ratio_low: Annotated[float, Field(ge=0)] = 0.8
    """Lower bound on pi_old / mu, trainer over sampler (not mu / pi_old: a bound ported from a framework
    that rejects on mu / pi_old becomes 1 / its upper bound here)."""
    ratio_high: PositiveFloat = 1.2
    """Upper bound on pi_old / mu, trainer over sampler (1 / the lower bound of an inverse-ratio threshold)."""
    diff_low: float | None = None
    """Optional bounds on p_old - p_mu as well (the diff filter)."""
    diff_high: float | None = None
    """Upper bound on p_old - p_mu (the diff filter); None: no upper bound."""
    normalize_weights: bool = False
    """Divide the importance weights by their mean over the batch's units (tokens; segments; rows at the
    geometric and sequence levels) after truncation, so they average 1 (verl's rollout_is_batch_normalize)."""
    divergence: Literal[("none", *DIVERGENCES.names)] = "none"
    """Reject tokens or rows whose estimate of KL(mu || pi_old) exceeds divergence_max: k2 = d^2 / 2 or
    k3 = exp(d) - 1 - d per token, d = log pi_old - log mu (verl's rollout_rs *_k2 / *_k3); none turns it off."""
    divergence_level: Literal[DIVERGENCE_LEVELS.names] = "sequence_mean"
    """What a token is judged by: its own estimate (token), or its row's sum, mean or max of them
    (sequence_sum, sequence_mean, sequence_max: the whole row stays or leaves; verl's seq_sum, seq_mean, seq_max)."""
    divergence_max: PositiveFloat = 0.01
    """The largest divergence kept (verl's decoupled_k3_rs: seq_mean_k3 at 0.01)."""

    @property
    def enabled(self) -> bool:
        return self.weight != "none" or self.filter != "none" or self.divergence != "none"

    @model_validator(mode="after")
    def _weights_to_normalize(self) -> MismatchConfig:
        if self.normalize_weights and self.weight == "none":
            raise ValueError("algorithm.mismatch.normalize_weights normalises the importance weights, which are off; "
                             "set algorithm.mismatch.weight (token, segment, geometric or sequence)")
        return self


PolicyLossKnobs = section_from_spec(
    PolicyLossSpec, "PolicyLossKnobs", __name__,
    """The policy-loss keys of the algorithm section: the fields of ``gyre.algos.policy_loss.PolicyLossSpec``
    (declared and documented there), checked here; ``AlgorithmConfig.loss_spec`` builds the spec back.""")


CreditKnobs = section_from_spec(
    CreditSpec, "CreditKnobs", __name__,
    """Attention-based credit (arXiv 2510.13554): the fields of ``gyre.algos.attention_credit.CreditSpec``
    (declared and documented there; tau_waad, tau_delta and alpha are unpublished, gyre's defaults).""")


class AlgorithmConfig(PolicyLossKnobs):
    """Advantage estimation, policy loss, aggregation, KL and masks. ``preset`` (or ``algorithm: NAME``)
    fills these knobs from ``gyre.config.presets``; keys written here override the preset's values.
    The policy-loss keys (policy_loss, ratio_level, clip_low, ..., loss_agg, kl_loss_coef,
    kl_loss_estimator, entropy_coef) come from ``PolicyLossKnobs``."""

    preset: str | None = None
    """grpo, dr_grpo, dapo, lite_ppo, ppo, reinforce_pp, reinforce_pp_baseline, rloo, gspo, cispo, topr, remax,
    opo, gpg, clip_cov, kl_cov, gmpo, sapo, asyppo, opd (``gyre.config.presets``: each sets the knobs of its
    paper; asyppo also sets critic.num_critics)."""
    # ---- advantages -------------------------------------------------------------------------
    estimator: Literal[ESTIMATORS.names] = "reinforce"
    """A name of ``gyre.algos.advantages.ESTIMATORS``. reinforce: (normalised) outcome reward as returns;
    rloo: leave-one-out baseline; group_centred_batch_std: group-centred over the batch std of the centred
    rewards, per response (REINFORCE++-baseline's response-level form); gae: PPO with a
    critic (creates the critic role). These treat a multi-turn trajectory as one action (its reward is the
    episode return). Credit per model turn, for runs that learn from an environment (``gyre.algos.agentic``):
    step_returns: the discounted return of the turn rewards from each turn on (gamma per turn), no
    baseline (norm scopes none); rebn: those returns normalised over every turn of the batch (GEM; scopes
    none); gigpo: the episode return normalised by the scopes (group/group is GiGPO, group/none its
    std-free variant) plus a step level over turns that saw the same state (the gigpo_* keys); chunk_returns
    (IPA): the normalised episode return discounted back from the last turn, gamma^(turns after) * R.
    Baselines that read more than the rewards (``gyre.algos.baselines``): remax: each prompt's greedy
    response's reward (the rollout adds one greedy sample per prompt, scored, never trained; scopes none);
    opo: the length-weighted group mean (scopes none); pass_at_k: how much a response raises its group's
    best-of-pass_k reward, over that reward's std (scopes none); gpg: the scoped normalisation (group
    mean, std group or none) times B / (B - M), M the samples of groups with equal rewards."""
    norm_mean: NormScope = "group"
    """Scope of the mean subtracted from rewards: group (per prompt), batch, running (per tag) or none."""
    norm_std: NormScope = "group"
    """Scope of the std rewards are divided by; none leaves the scale."""
    std_eps: PositiveFloat = 1e-6
    """Added to every std of this section, (x - mean) / (std + std_eps): the norm scopes, whitening, turn credit."""
    std_ddof: Literal[0, 1] = 1
    """Degrees of freedom of those stds: 1 the sample std (torch's default), 0 the population std."""
    reward_clip: PositiveFloat | None = None
    """Clamp the (normalised) rewards to +-value."""
    gamma: UnitFloat = 1.0
    """Discount per token of the returns and GAE; per model turn for step_returns, rebn and chunk_returns
    (GEM uses 0.9 in its games)."""
    lam: UnitFloat = 0.95
    """GAE lambda."""
    gigpo_step_gamma: UnitFloat = 0.95
    """gigpo: discount per turn of the step level's returns (ROLL ``step_reward_gamma``)."""
    gigpo_episode_weight: Annotated[float, Field(ge=0)] = 1.0
    """gigpo: weight w_E of the episode-level advantage (ROLL ``episode_reward_weight``)."""
    gigpo_step_weight: Annotated[float, Field(ge=0)] = 1.0
    """gigpo: weight w_S of the step-level advantage (ROLL ``step_reward_weight``; the paper's omega). The
    step level divides by its anchor group's std (std_eps, std_ddof) unless norm_std is none."""
    pass_k: PositiveInt = 4
    """pass_at_k: k, the subset size whose best reward the advantage raises (at most
    rollout.samples_per_prompt; k = 1 is GRPO with the population std)."""
    whiten_advantages: bool = False
    """Whiten advantages over the tokens that train, (A - mean) / (std + std_eps) with std_ddof, mean and
    std over tokens (longer responses weigh more); with a critic-free estimator these are the returns after
    the KL penalty, which is REINFORCE++'s normalisation. Fewer than 2 tokens: left as they are; all equal: 0."""
    advantage_clip: PositiveFloat | None = None
    """Clamp the final advantages to +-value; None: no clamp."""
    # ---- policy loss: the keys of PolicyLossKnobs, and the aggregation constant ------------
    loss_agg_norm: PositiveInt | None = None
    """The constant of seq-mean-token-sum-norm; default rollout.sampling.max_new_tokens."""
    # ---- KL (the KL loss term is a policy-loss key) ---------------------------------------
    kl_reward_coef: Annotated[float, Field(ge=0)] = 0.0
    """Per-token KL penalty subtracted from the rewards (PPO / REINFORCE++ style); > 0 creates the reference."""
    kl_reward_estimator: Literal["k1", "k2", "k3", "abs"] = "k1"
    """The per-token KL estimate subtracted from the token rewards when kl_reward_coef > 0
    (``gyre.algos.kl``; clamped by kl_clamp)."""
    kl_target: PositiveFloat | None = None
    """Adaptive KL coefficient (arXiv 1909.08593) aiming at this per-token KL; None keeps it fixed."""
    kl_horizon: PositiveInt = 10000
    """Adaptive KL (kl_target): the horizon of the proportional controller, in samples (arXiv 1909.08593)."""
    # ---- on-policy distillation (gyre.algos.distill) --------------------------------------
    distill_coef: Annotated[float, Field(ge=0)] = 0.0
    """Weight of the per-token reverse KL to the teacher (ROLL ``opd_kl_coef``); > 0 creates the teacher role
    (the ``teacher`` section names its model)."""
    distill_mode: DistillMode = "advantage"
    """pure: each token's advantage is -distill_coef * (log pi_student - log pi_teacher) of its sampled token
    and the task reward is unused (ROLL ``is_pure_opd``; the opd preset). advantage: that term is added to
    the RL advantage after the estimator, before whitening (ROLL ``use_opd``). loss: the RL advantage is
    left alone and distill_coef * 1/2 (log pi_theta - log pi_teacher)^2 joins the loss, whose gradient is
    the reverse-KL gradient on the student's samples."""
    # ---- masks and shaping ------------------------------------------------------------------
    overlong_mask: bool = False
    """Truncated responses (hit max_new_tokens) leave the loss (DAPO overlong filtering)."""
    overlong_penalty_frac: Annotated[float, Field(gt=0, le=1)] | None = None
    """DAPO soft overlong punishment with L_cache = this fraction of max_new_tokens; None turns it off."""
    difficulty_mask: tuple[UnitFloat, UnitFloat] | None = None
    """(low, high): keep a prompt's group only if low < mean reward < high; (0, 1) drops groups with no
    reward variance (DAPO's dynamic-sampling filter)."""
    mismatch: MismatchConfig = MismatchConfig()
    """Train-inference mismatch correction: importance weights and rejection by pi_old / mu."""
    credit: CreditKnobs = CreditKnobs()
    """Attention-based credit: non-negative advantages of selected tokens scaled by gamma_amp, the tokens
    chosen from the policy's own attention (local_chunk, global_anchor, coupled: an extra eager-attention
    forward of the policy per step), its entropy, or at random; strategy none (the default) turns it off."""
    # ---- critic (estimator gae) -------------------------------------------------------------
    value_clip: PositiveFloat | None = None
    """Clip the new values to within +-value of the old ones in the critic's loss (PPO's value clip);
    None: no clip."""
    critic_warmup: NonNegInt = 0
    """RL steps that train only the critic before the policy starts to move."""
    value_aggregation: Literal["mean", "min"] = "mean"
    """With critic.num_critics > 1, the value GAE uses: the critics' mean (AsyPPO; its ablation favours it)
    or their min."""
    critic_data_division: Literal["group_response_split", "prompt_shard"] = "group_response_split"
    """How each batch's rows are divided among several critics (critic.num_critics > 1), each training on its
    share only: group_response_split gives every critic an equal share of each prompt's responses
    (rollout.samples_per_prompt a multiple of num_critics); prompt_shard gives each critic whole prompts
    (rollout.prompts_per_step a multiple of num_critics)."""
    adv_mask_low_pct: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """AsyPPO's advantage mask, a fraction k: the advantages of the ceil(k * n) valid tokens of the batch
    where the critics disagree least (lowest std of their values) become 0; needs critic.num_critics >= 2."""
    entropy_filter_high_pct: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """AsyPPO's entropy filter, a fraction h: the ceil(h * n) valid tokens where the critics disagree most
    leave the entropy term (entropy_coef); needs critic.num_critics >= 2."""
    old_logprobs: Literal["auto", "recompute", "rollout"] = "auto"
    """Where pi_old comes from: recompute with the trainer, or the sampler's log-probs; auto recomputes
    when there is more than one optimizer step per rollout batch (else the detached current ones serve)."""

    @model_validator(mode="before")
    @classmethod
    def _expand_preset(cls, data: object) -> object:
        return expand_preset(data)

    @model_validator(mode="after")
    def _consistent(self) -> AlgorithmConfig:
        for problem in algorithm_problems(self):
            raise ValueError(problem)
        return self

    @property
    def advantage_estimator(self) -> AdvantageEstimator:
        """The row of ``ESTIMATORS`` that ``estimator`` names."""
        return ESTIMATORS.get(self.estimator)

    @property
    def uses_turns(self) -> bool:
        """The estimator assigns credit per model turn (multi-turn trajectories only)."""
        return self.advantage_estimator.turns is not None

    @property
    def turn_spec(self) -> TurnSpec:
        """The knobs of the turn-level estimators, from this section."""
        return TurnSpec(gamma=self.gamma, eps=self.std_eps, ddof=self.std_ddof,
                        gigpo_step_gamma=self.gigpo_step_gamma, gigpo_episode_weight=self.gigpo_episode_weight,
                        gigpo_step_weight=self.gigpo_step_weight, gigpo_step_std=self.norm_std != "none")

    @property
    def loss_variant(self) -> PolicyLossVariant:
        """The row of ``POLICY_LOSSES`` that ``policy_loss`` names."""
        return POLICY_LOSSES.get(self.policy_loss)

    @property
    def uses_critic(self) -> bool:
        return self.advantage_estimator.critic

    def loss_spec(self, temperature: float, old_source: OldSource) -> PolicyLossSpec:
        """The loss spec trainers get: this section's policy-loss keys by name, and the run's values."""
        return PolicyLossSpec(temperature=temperature, old_source=old_source,
                              distill_loss_coef=self.distill_coef if self.distill_mode == "loss" else 0.0,
                              **{name: getattr(self, name) for name in PolicyLossKnobs.model_fields})

    @property
    def credit_spec(self) -> CreditSpec:
        """The attention-credit knobs as the trainer and the advantage stage take them."""
        return CreditSpec(**self.credit.model_dump())

    @property
    def uses_teacher(self) -> bool:
        """On-policy distillation: a teacher role scores every batch."""
        return self.distill_coef > 0

    @property
    def uses_reference(self) -> bool:
        return self.kl_loss_coef > 0 or self.kl_reward_coef > 0

    @property
    def needs_trainer_old_logprobs(self) -> list[str]:
        """Knobs that compare the trainer's pi_old with the sampler's log-probs (so pi_old is recomputed)."""
        return [knob for knob, on in ((f"policy_loss={self.policy_loss}", self.loss_variant.uses_behaviour),
                                      ("algorithm.mismatch", self.mismatch.enabled)) if on]

    @property
    def uses_groups(self) -> bool:
        """Whether advantages or masks compare the samples of one prompt with each other."""
        return ("group" in (self.norm_mean, self.norm_std) or self.advantage_estimator.groups
                or self.difficulty_mask is not None)


class ValidationConfig(StrictModel):
    every: NonNegInt = 0
    """Validate every this many steps (and before the first and after the last); 0 turns it off."""
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
    """Advantage estimator, policy loss, KL and masks (or a preset)."""
    reference: ReferenceConfig = ReferenceConfig()
    """The KL reference model's placement (used only when a KL term asks for it)."""
    teacher: TeacherConfig = TeacherConfig()
    """The teacher model of on-policy distillation (used only when algorithm.distill_coef > 0)."""
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
    def _warmup_template(self) -> RLVRConfig:
        sft = self.sft_warmup
        if sft is not None and (sft.system_prompt is not None or sft.chat_template_kwargs):
            raise ValueError("sft_warmup renders its prompts like the RL prompts: set data.system_prompt and "
                             "data.chat_template_kwargs instead of sft_warmup.system_prompt / chat_template_kwargs")
        return self
