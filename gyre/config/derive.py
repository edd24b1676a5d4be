"""Derived values and the placement plan, computed once from a validated config and then printed.

Everything here is pure arithmetic over the config and a device count, so ``gyre check`` can run it
without starting Ray, and a bad batch size or an impossible placement fails before any heavy work.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel

from gyre.algos.loss_table import OldSource
from gyre.config.backend import (
    attention_notes,
    backend_notes,
    check_attention,
    check_hybrid,
    compute_dtype,
    judge_engine_notes,
    precision_notes,
    weight_transport,
)
from gyre.config.devices import check_devices_exist, rollout_engines, shared_devices, worker_devices
from gyre.config.env_schema import EnvConfig
from gyre.config.load import ConfigError
from gyre.config.schema import RLVRConfig, SFTConfig

DeviceKind = Literal["cpu", "cuda"]


@dataclass(frozen=True)
class RunPlan:
    """What the driver will build. Device indices refer to GPUs (cuda) or CPU slots (cpu)."""

    device_kind: DeviceKind
    num_devices: int | None
    """Devices that exist (None: not known until gyre joins the cluster)."""
    roles: dict[str, tuple[int, ...]]
    """Device list of each device-holding role: policy, rollout and (when used) reference and critic."""
    shared_devices: dict[tuple[str, str], tuple[int, ...]]
    """Pairs of roles that time-share devices, with the devices they share."""
    hybrid_rollout: bool
    """The policy ranks sample too (rollout.mode hybrid): no rollout role of its own, no weight transfer."""
    weight_transport: Literal["none", "channel", "object_store"]
    """How weights reach the engines (``gyre.config.backend.weight_transport``)."""
    offload: bool
    dp_size: int
    rollout_workers: int
    """Rollout engines: rollout devices / rollout.tensor_parallel_size (each a worker of the rollout role)."""
    rollout_batch: int
    mini_batch_size: int
    optimizer_steps_per_step: int
    rows_multiple: int
    """Training batches are padded with empty rows to a multiple of this (mini-batches per epoch x ranks):
    step-level samples make batches of varying row counts, and data-parallel ranks need equal shares."""
    samples_per_rank: int
    micro_batches_per_rank: int
    total_optimizer_steps: int
    old_source: OldSource
    """Where pi_old comes from: recomputed by the trainer, the sampler's log-probs (rollout), or the
    detached log-probs of the training forward pass (current: one optimizer step per batch)."""
    use_reference: bool
    reference_on_policy: bool
    """LoRA: the reference log-probs come from the policy ranks with the adapters switched off (the base
    model), so there is no reference role."""
    use_critic: bool
    """algorithm.advantage.estimator gae: a critic role (value model) trains beside the policy."""
    reward_workers: int
    """CPU reward-worker actors over all function domains (each takes one CPU outside the device slots)."""
    critic_dp_size: int
    loss_agg_norm: int | None
    """The constant of seq-mean-token-sum-norm (None for the other modes)."""
    overlong_cache_tokens: int | None
    """L_cache of DAPO's soft overlong punishment (None: off)."""
    threads_per_worker: int
    sft_steps: int
    """SFT warm-up optimizer steps: sft_warmup.steps, or with sft_warmup.epochs derived from the warm-up's
    examples once they are loaded (``with_warmup``; 0 until then)."""
    notes: list[str] = field(default_factory=list)
    sft_length: str = ""
    """How the warm-up's steps were derived from sft_warmup.epochs (empty for a step count)."""
    critic_roles: tuple[str, ...] = ()
    """The critics' role names in ``roles``: critic (PPO), or critic.0 ... critic.M-1 (critic.num_critics = M)."""
    use_teacher: bool = False
    """On-policy distillation (algorithm.distill.coef > 0): a teacher role scores every batch."""
    memory: tuple[str, ...] = ()
    """Each role's estimated peak memory per device (``gyre.config.memory``; filled by the pre-flight)."""
    rollout_tp: int = 1
    """Devices of one rollout engine (rollout.tensor_parallel_size): its worker holds them all."""

    @property
    def recompute_old_logprobs(self) -> bool:
        """The trainer runs a forward pass of each batch for pi_old before training."""
        return self.old_source == "recomputed"

    def with_warmup(self, sft: SFTConfig | None, examples: int) -> RunPlan:
        """This plan with the SFT warm-up's steps over its ``examples`` loaded examples."""
        if sft is None or sft.epochs is None:
            return self
        return dataclasses.replace(self, sft_steps=sft.total_steps(examples), sft_length=sft.describe_length(examples))

    @property
    def layout(self) -> str:
        if self.hybrid_rollout:
            return "hybrid" + (", with time-shared roles" if self.shared_devices else "")
        if not self.shared_devices:
            return "disaggregated"
        every = set().union(*self.roles.values())
        if all(set(d) == every for d in self.roles.values()):
            return "colocated"
        return "partly colocated"

    def roles_on_device(self, device: int) -> int:
        """How many roles use ``device``: each of their workers there gets that share of it."""
        return sum(1 for devices in self.roles.values() if device in devices)

    def worker_devices(self, role: str) -> tuple[tuple[int, ...], ...]:
        """The devices of each worker of ``role``: one each, a tensor-parallel engine's several."""
        return worker_devices(self.roles[role], self.rollout_tp if role == "rollout" else 1)


def detect_local_devices(cfg: RLVRConfig) -> tuple[DeviceKind, int]:
    """(device kind, how many devices exist) on this machine, for an embedded local Ray."""
    kind = cfg.cluster.device
    if kind in ("auto", "cuda"):
        import torch  # local import: `gyre check` on CPU must not pay for it when device == "cpu"

        gpus = torch.cuda.device_count()
        if kind == "cuda" and gpus == 0:
            raise ConfigError('cluster.device is "cuda" but no GPU is visible here; set cluster.device=cpu')
        if gpus > 0:
            return "cuda", gpus
    return "cpu", cfg.cluster.cpu_slots or (os.cpu_count() or 1)


def make_plan(cfg: RLVRConfig, device_kind: DeviceKind, num_devices: int | None) -> RunPlan:
    """Validate batch arithmetic and placement; raise ConfigError naming the key to change.

    ``num_devices`` None (a cluster not joined yet) checks everything but whether the devices exist."""
    notes: list[str] = []
    a = cfg.algorithm
    use_reference = a.uses_reference
    reference_on_policy = use_reference and cfg.policy.lora is not None
    if use_reference:
        notes.append(_reference_note(cfg))
    use_critic = a.uses_critic
    hybrid = check_hybrid(cfg, notes)
    _check_rollout_schedule(cfg, hybrid, notes)
    notes += attention_notes(cfg, device_kind, hybrid)
    notes += precision_notes(cfg.model.dtype, device_kind)
    roles = {"policy": cfg.policy.devices} if hybrid else {"policy": cfg.policy.devices, "rollout": cfg.rollout.devices}
    if use_reference and not reference_on_policy:
        roles["reference"] = cfg.reference.devices
    critics = critic_role_names(cfg.critic.num_critics) if use_critic else ()
    for name in critics:
        roles[name] = cfg.critic.devices
    if a.uses_teacher:
        roles["teacher"] = cfg.teacher.devices
        notes.append(_teacher_note(cfg))
    roles.update(_reward_model_roles(cfg, device_kind, notes))
    _note_judge_budgets(cfg, notes)
    if num_devices is not None:
        check_devices_exist(roles, device_kind, num_devices)
    shared = shared_devices(roles)
    mode = cfg.policy.offload
    offload = mode == "always" or (mode == "auto" and device_kind == "cuda" and bool(shared))

    dp = len(cfg.policy.devices)
    n = cfg.rollout.samples_per_prompt
    _check_groups(cfg)
    _check_turns(cfg, notes)
    _check_critics(cfg, notes)
    _check_baselines(cfg)
    rollout_batch = cfg.rollout.prompts_per_step * n
    mini = cfg.policy.mini_batch_size or rollout_batch
    if rollout_batch % mini:
        raise ConfigError(
            f"policy.mini_batch_size={mini} must divide the rollout batch {rollout_batch} "
            f"(rollout.prompts_per_step={cfg.rollout.prompts_per_step} x rollout.samples_per_prompt={n}); "
            f"try one of {_divisors(rollout_batch, dp)}")
    for role, ranks in (("policy", dp), ("critic", len(cfg.critic.devices) if use_critic else 1)):
        if mini % ranks:
            raise ConfigError(
                f"policy.mini_batch_size={mini} must be divisible by the {ranks} {role} devices (data-parallel "
                f"ranks); try one of {_divisors(rollout_batch, ranks)}")
    steps_per_batch = optimizer_steps_per_batch(cfg)
    per_rank = mini // dp
    old_source = _old_source(cfg, steps_per_batch, notes)
    _note_rollout_logprobs(cfg, old_source, notes, device_kind)
    _note_algorithm(cfg, steps_per_batch, notes)
    agg_norm = (a.loss.agg_norm or _response_budget(cfg)) if a.loss.agg == "seq-mean-token-sum-norm" else None
    # The overlong penalty measures each response (each model turn, in an episode) against its own budget.
    turn_budget = cfg.env.turn_tokens if cfg.env is not None else cfg.rollout.sampling.max_new_tokens
    cache = max(1, round(a.masks.overlong_penalty_frac * turn_budget)) if a.masks.overlong_penalty_frac else None
    sft_steps = _check_sft(cfg, dp)
    if cfg.validation.every and cfg.data is not None and not cfg.data.val_files:
        raise ConfigError("validation.every > 0 needs data.val_files (held-out prompts); or set validation.every=0")
    engines = rollout_engines(cfg, roles, device_kind, notes)
    return RunPlan(
        device_kind=device_kind, num_devices=num_devices, roles=roles, shared_devices=shared, hybrid_rollout=hybrid,
        weight_transport=weight_transport(cfg, hybrid, device_kind, notes), offload=offload,
        dp_size=dp, rollout_workers=engines, rollout_batch=rollout_batch, mini_batch_size=mini,
        optimizer_steps_per_step=steps_per_batch, samples_per_rank=per_rank,
        rows_multiple=rollout_batch // mini * math.lcm(dp, len(cfg.critic.devices) * len(critics) if use_critic else 1),
        micro_batches_per_rank=-(-per_rank // cfg.policy.micro_batch_size),
        total_optimizer_steps=steps_per_batch * cfg.run.steps, old_source=old_source,
        use_reference=use_reference, reference_on_policy=reference_on_policy, use_critic=use_critic,
        reward_workers=sum(d.workers for d in cfg.reward.domains.values() if d.model_role is None)
        if cfg.env is None else math.ceil(cfg.env.workers * cfg.env.worker_cpus),
        critic_dp_size=len(cfg.critic.devices) if use_critic else 0,
        loss_agg_norm=agg_norm, overlong_cache_tokens=cache, threads_per_worker=cfg.cluster.threads_per_slot,
        sft_steps=sft_steps, critic_roles=critics, use_teacher=a.uses_teacher,
        notes=notes, rollout_tp=cfg.rollout.tensor_parallel_size)


def critic_role_names(num_critics: int) -> tuple[str, ...]:
    """critic for PPO's single critic; critic.0 ... critic.M-1 for M critics (AsyPPO)."""
    return ("critic",) if num_critics == 1 else tuple(f"critic.{m}" for m in range(num_critics))


def _check_critics(cfg: RLVRConfig, notes: list[str]) -> None:
    """Several critics (AsyPPO) split every batch evenly; their disagreement needs at least two of them."""
    a, c = cfg.algorithm, cfg.critic
    m = c.num_critics
    masks = [f"algorithm.critic.{k}" for k in ("adv_mask_low_pct", "entropy_filter_high_pct")
             if getattr(a.critic, k) > 0]
    if masks and m < 2:
        raise ConfigError(f"{' and '.join(masks)} rank the disagreement (std) of several critics' values, "
                          f"but critic.num_critics={m}; set critic.num_critics >= 2 (algorithm=asyppo sets 2), or "
                          "set them to 0")
    if a.critic.entropy_filter_high_pct > 0 and a.loss.entropy_coef == 0:
        notes.append("algorithm.critic.entropy_filter_high_pct: no effect, algorithm.loss.entropy_coef is 0 "
                     "(no entropy term)")
    if m == 1:
        return
    if not a.uses_critic:
        notes.append(f"critic.num_critics={m}: no effect, estimator={a.advantage.estimator} has no critic")
        return
    rollout = cfg.rollout
    division = a.critic.data_division
    share, what = ((rollout.samples_per_prompt, "rollout.samples_per_prompt") if division == "group_response_split"
                   else (rollout.prompts_per_step, "rollout.prompts_per_step"))
    if share % m:
        raise ConfigError(f"algorithm.critic.data_division={division} gives each of the {m} critics "
                          f"an equal share of {what}={share}; make it a multiple of critic.num_critics")
    mini = cfg.policy.mini_batch_size or rollout.prompts_per_step * rollout.samples_per_prompt
    ranks = len(c.devices)
    if mini % (m * ranks):
        raise ConfigError(f"policy.mini_batch_size={mini} is divided among {m} critics of {ranks} rank(s) each, so "
                          f"it must be a multiple of {m * ranks}")


def _reference_note(cfg: RLVRConfig) -> str:
    a = cfg.algorithm
    kl = f"KL to the reference (kl.loss_coef={a.kl.loss_coef}, kl.reward_coef={a.kl.reward_coef})"
    if cfg.policy.lora is None:
        return f"{kl}: a reference role is created on devices {list(cfg.reference.devices)}"
    unused = " (the reference section has no effect)" if cfg.reference.model_fields_set else ""
    return (f"{kl}: with policy.lora the reference is the policy's base model, its adapters switched off, scored "
            f"by the policy ranks: no reference role, no second copy of the model{unused}")


def _teacher_note(cfg: RLVRConfig) -> str:
    """The teacher needs a model; say what its signal does (ConfigError without a model)."""
    a = cfg.algorithm
    if cfg.teacher.model_path is None:
        raise ConfigError(f"algorithm.distill.coef={a.distill.coef:g} distils from a teacher model, but "
                          "teacher.model_path is not set: name the teacher's model directory (or cached Hub id), "
                          "one that uses the student's tokenizer; or set algorithm.distill.coef=0")
    mode, c, d = a.distill.mode, f"{a.distill.coef:g}", "(log pi_student - log pi_teacher)"
    what = {"pure": f"each token's advantage is -{c} x {d} (the task reward is not used)",
            "advantage": f"-{c} x {d} is added to each token's RL advantage",
            "loss": f"{c} x 1/2 {d}^2 joins the loss (its gradient is the reverse KL's)"}
    return (f"on-policy distillation ({mode}): {what[mode]}; a teacher role is created on "
            f"devices {list(cfg.teacher.devices)}")


def _reward_model_roles(cfg: RLVRConfig, device_kind: str, notes: list[str]) -> dict[str, tuple[int, ...]]:
    """Device roles of local judges and reward models; they stay resident (never offloaded)."""
    roles = {f"{d.model_role}.{name}": d.scoring_model.devices for name, d in cfg.reward.domains.items()
             if d.model_role is not None}
    for role, devices in roles.items():
        if device_kind == "cuda" and set(devices) & set(cfg.rollout.devices):
            notes.append(f"warning: {role} shares GPUs {sorted(set(devices) & set(cfg.rollout.devices))} with the "
                         "rollout and stays resident there: leave room for it in the rollout's memory")
    return roles


def _note_judge_budgets(cfg: RLVRConfig, notes: list[str]) -> None:
    """An endpoint judge's retries must fit the sample's reward timeout; a local judge on vLLM is noted."""
    notes += judge_engine_notes(cfg.reward.domains)
    for name, domain in cfg.reward.domains.items():
        j = domain.judge
        if j is not None and j.backend == "openai" and domain.sample_timeout_s < (j.retries + 1) * j.request_timeout_s:
            notes.append(f"reward.domains.{name}.timeout_s={domain.sample_timeout_s:g} is below the judge's "
                         f"{j.retries + 1} attempts x request_timeout_s={j.request_timeout_s:g}: a slow endpoint "
                         "becomes a reward timeout before its retries run out")


def optimizer_steps_per_batch(cfg: RLVRConfig) -> int:
    """Optimizer steps one rollout batch gives: policy.epochs x its mini-batches (``make_plan`` checks that
    they divide it)."""
    rollout_batch = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
    return cfg.policy.epochs * rollout_batch // (cfg.policy.mini_batch_size or rollout_batch)


def old_source(cfg: RLVRConfig) -> OldSource:
    """Where pi_old comes from, as ``make_plan`` decides it (without its notes or placement checks)."""
    return _old_source(cfg, optimizer_steps_per_batch(cfg), [])


def _old_source(cfg: RLVRConfig, steps_per_batch: int, notes: list[str]) -> OldSource:
    """Where pi_old comes from (``algorithm.old_logprobs``; auto decided here, with a note saying why)."""
    a, alpha = cfg.algorithm, cfg.rollout.async_ratio
    needs = a.needs_trainer_old_logprobs
    if a.old_logprobs != "auto":
        if a.old_logprobs == "recompute" and alpha > 0 and not needs:
            notes.append(f"warning: rollout.async_ratio={alpha:g} trains on samples up to {math.ceil(alpha)} "
                         "version(s) old and nothing corrects for it (algorithm.old_logprobs=recompute: the ratio is "
                         "not taken against the policy that sampled): use algorithm.old_logprobs=auto, "
                         "algorithm.mismatch.weight=token or algorithm.loss.variant=decoupled_ppo")
        return "recomputed" if a.old_logprobs == "recompute" else "rollout"
    if a.mismatch.enabled or (needs and steps_per_batch > 1):
        # With one optimizer step the detached current log-probs are pi_old exactly, so a loss that compares
        # pi_old with the sampler needs no extra forward pass; mismatch correction weighs the batch before it.
        notes.append(f"old log-probs recomputed by the trainer: {', '.join(needs)} compare(s) pi_old with the "
                     "sampler's log-probs")
        return "recomputed"
    if alpha > 0 and not needs:
        # Against the current weights the ratio of a stale sample is 1 and corrects nothing; against the policy
        # that sampled it the loss's clip bounds how far it moves the policy. bench/rollout_schedules.py (alpha
        # 2, 3 seeds, 60 steps): matched synchronous held-out reward; without it 0.05 (window) / 0.15 below.
        notes.append(f"rollout.async_ratio={alpha:g}: old log-probs are the sampler's, so the loss's ratio and clip "
                     f"are taken against the (up to {math.ceil(alpha)} versions old) policy that sampled each token "
                     "(algorithm.old_logprobs=auto)")
        return "rollout"
    recompute = steps_per_batch > 1
    notes.append(
        f"{steps_per_batch} optimizer step(s) per rollout batch: old log-probs "
        + ("recomputed by the trainer" if recompute else "taken from the first forward pass (detached)"))
    return "recomputed" if recompute else "current"


def _check_groups(cfg: RLVRConfig) -> None:
    """Group-relative advantages need several samples per prompt, and samples that can differ."""
    a = cfg.algorithm
    if not a.uses_groups:
        return
    adv = a.advantage
    what = (f"estimator={adv.estimator}" if adv.row.groups else
            "masks.difficulty" if a.masks.difficulty is not None and "group" not in (adv.norm_mean, adv.norm_std)
            else f"norm_mean={adv.norm_mean}, norm_std={adv.norm_std}")
    if cfg.rollout.samples_per_prompt < 2:
        raise ConfigError(f"algorithm {what} compares the samples of each prompt, so rollout.samples_per_prompt "
                          "must be >= 2; or use a batch-level estimator (e.g. algorithm=reinforce_pp or ppo)")
    if cfg.rollout.sampling.temperature == 0:
        raise ConfigError(f"rollout.sampling.temperature=0 samples every response of a prompt identically, so the "
                          f"group-relative advantages of algorithm {what} are all 0; use a temperature > 0 "
                          "(greedy decoding suits validation.temperature)")


def _check_baselines(cfg: RLVRConfig) -> None:
    """Estimators that need more of the rollout than the group: pass@k's k samples, ReMax's greedy response."""
    a, r = cfg.algorithm.advantage, cfg.rollout
    if a.estimator == "pass_at_k" and a.pass_at_k.k > r.samples_per_prompt:
        raise ConfigError(f"algorithm.advantage.pass_at_k.k={a.pass_at_k.k} draws subsets of {a.pass_at_k.k} samples "
                          f"of each prompt, but rollout.samples_per_prompt={r.samples_per_prompt}; set k <= "
                          "samples_per_prompt")
    if not a.row.greedy:
        return
    if cfg.env is not None:
        raise ConfigError(f"algorithm.advantage.estimator={a.estimator} takes each prompt's greedy response as "
                          "its baseline, which the rollout generates for prompts, not for environment episodes; "
                          "choose another estimator (e.g. algorithm=grpo or rloo) for an environment")
    if r.sampling.temperature == 0:
        raise ConfigError(f"rollout.sampling.temperature=0 makes every sample the greedy response, so "
                          f"algorithm.advantage.estimator={a.estimator} (greedy baseline) gives every advantage 0; "
                          "use a temperature > 0")


def _response_budget(cfg: RLVRConfig) -> int:
    """Most new tokens one response may have: a multi-turn row's model turns share the turn budget."""
    if cfg.env is None:
        return cfg.rollout.sampling.max_new_tokens
    return cfg.env.turn_tokens * (1 if cfg.env.samples == "step" else cfg.env.max_turns)


def _check_turns(cfg: RLVRConfig, notes: list[str]) -> None:
    """Credit per model turn needs multi-turn episodes; a run that learns from prompts samples single responses."""
    a = cfg.algorithm
    if a.uses_turns and cfg.data is not None:
        raise ConfigError(f"algorithm.advantage.estimator={a.advantage.estimator} assigns credit to the turns of "
                          "multi-turn episodes, but this run learns from prompts (data), whose samples are single "
                          "responses; choose a trajectory-level estimator (e.g. algorithm=grpo or rloo) or learn from "
                          "an environment")
    env = cfg.env
    default_history = EnvConfig.model_fields["history_turns"].default
    if env is not None and env.samples != "step" and env.history_turns != default_history:
        notes.append(f"env.history_turns={env.history_turns}: no effect, trajectory-level samples show every turn "
                     "(set env.samples: step for a history window)")
    if a.uses_critic and env is not None and env.samples == "step":
        raise ConfigError(f"algorithm.advantage.estimator={a.advantage.estimator} learns a value of each token of one "
                          "sequence, but env.samples=step trains every turn as a sequence of its own whose context "
                          "drops earlier turns; use env.samples: trajectory, or a critic-free estimator (e.g. grpo, "
                          "step_returns, gigpo)")


def _note_algorithm(cfg: RLVRConfig, steps_per_batch: int, notes: list[str]) -> None:
    a = cfg.algorithm
    credit = a.credit_spec
    if credit.strategy != "none":
        how = {"random": "a random share of tokens (the paper's baseline)",
               "entropy": "the highest-entropy tokens, from one more forward of the policy per step",
               }.get(credit.strategy, f"the policy's attention in {credit.layers} middle-third layers, from one more "
                                      "forward of the policy per step with eager attention (the maps exist only "
                                      "there; bench/attention_credit.py measures the cost)")
        notes.append(f"attention-based credit ({credit.strategy}): non-negative advantages of the top "
                     f"{credit.top_q:.0%} tokens of each response are scaled by {credit.gamma_amp:g}, chosen by {how}")
    if "mode" in a.distill.model_fields_set and not a.uses_teacher:
        notes.append("algorithm.distill.mode: no effect, algorithm.distill.coef is 0 (no teacher)")
    notes += _unused_variant_knobs(a.advantage, "advantage", "estimator") + _unused_variant_knobs(a.loss, "loss",
                                                                                                  "variant")
    estimator = a.advantage.estimator
    if estimator == "opo" and steps_per_batch > 1:
        notes.append(f"estimator=opo derives its baseline for exact on-policy training (one optimizer step per "
                     f"rollout batch); this run takes {steps_per_batch} (policy.mini_batch_size, policy.epochs)")
    if not a.uses_critic and (a.critic.value_clip is not None or a.critic.warmup):
        notes.append(f"algorithm.critic.value_clip / warmup have no effect: estimator={estimator} has no critic")
    if a.critic.warmup >= cfg.run.steps and a.uses_critic:
        raise ConfigError(f"algorithm.critic.warmup={a.critic.warmup} >= run.steps={cfg.run.steps}: the policy "
                          "would never train")
    if not a.loss.row.has_ratio and steps_per_batch > 1:
        notes.append(f"warning: loss.variant={a.loss.variant} has no importance ratio, so it is only correct "
                     f"on-policy; with {steps_per_batch} optimizer steps per rollout batch later steps are off-policy")
    if a.masks.difficulty == (0.0, 1.0):
        notes.append("algorithm.masks.difficulty (0, 1): groups whose samples all score the same leave the loss "
                     "(no refill: the batch shrinks instead)")


def _unused_variant_knobs(section, name: str, selector: str) -> list[str]:
    """Knobs written (by the user or the preset) in the sub-section of a variant the run does not use."""
    chosen = getattr(section, selector)
    notes = []
    for variant in sorted(section.model_fields_set - {chosen}):
        knobs = getattr(section, variant)
        if isinstance(knobs, BaseModel) and knobs.model_fields_set:  # a variant's sub-section, written to
            keys = ", ".join(f"algorithm.{name}.{variant}.{k}" for k in sorted(knobs.model_fields_set))
            notes.append(f"{keys}: no effect, {selector}={chosen} is not {variant}")
    return notes


def _check_rollout_schedule(cfg: RLVRConfig, hybrid: bool, notes: list[str]) -> None:
    r = cfg.rollout
    notes += backend_notes(r.backend, hybrid)
    if r.async_ratio > 0:
        if hybrid:
            raise ConfigError(f"rollout.async_ratio={r.async_ratio:g} overlaps rollout with training, which needs "
                              "rollout engines of their own: set rollout.mode=separate")
        shared = sorted(set(r.devices) & set(cfg.policy.devices))
        if shared:
            raise ConfigError(f"rollout.async_ratio={r.async_ratio:g} overlaps rollout with training, but rollout and "
                              f"policy share devices {shared}: give rollout.devices and policy.devices disjoint "
                              "devices, or set rollout.async_ratio=0")
        if r.tail_batching is not None:
            raise ConfigError("rollout.tail_batching keeps synchronous semantics: it needs rollout.async_ratio=0")
        if r.async_mode == "lockstep" and r.redundancy:
            raise ConfigError("rollout.async_mode=lockstep fixes which groups train in advance, rollout.redundancy "
                              "keeps the first to finish: set rollout.redundancy=0 or rollout.async_mode=window")
        if r.async_mode == "lockstep":
            lo, hi = math.floor(r.async_ratio), math.ceil(r.async_ratio)
            versions = f"n-1-{hi}" if lo == hi else f"n-1-{hi} (the oldest_quota share) and n-1-{lo} (the rest)"
            notes.append(f"rollout.async_mode=lockstep: step n trains on groups generated by policy version "
                         f"{versions}, fixed in advance: reproducible from the seed, resumes exactly")
        if r.schedule == "sync":
            notes.append(f"rollout.async_ratio={r.async_ratio:g}: samples are queued one request each (queue "
                         "scheduling), over engines that keep generating while the policy trains")
    if r.tail_batching is not None and r.dynamic_sampling is not None:
        raise ConfigError("rollout.tail_batching and rollout.dynamic_sampling both decide which groups of a round "
                          "train: use one of them")
    if r.dynamic_sampling is not None and cfg.algorithm.masks.difficulty is not None:
        notes.append("rollout.dynamic_sampling refills dropped groups, algorithm.masks.difficulty zeroes groups that "
                     "are generated: with both, a group can be masked that the filter kept")


def _note_rollout_logprobs(cfg: RLVRConfig, source: OldSource, notes: list[str], device_kind: str) -> None:
    """pi_old from the sampler is only unbiased when sampler and trainer compute the same distribution."""
    s = cfg.rollout.sampling
    if source != "rollout":
        return
    if s.top_p < 1 or s.top_k > 0:
        notes.append("warning: old log-probs from the sampler with top_p/top_k: the sampler's log-probs are "
                     "renormalised over the kept tokens, the trainer's are not, so the PPO ratio is biased")
    if (dtype := compute_dtype(cfg.model.dtype, device_kind)) != "float32":
        notes.append(f"warning: old log-probs from the sampler with a {dtype} rollout: the ratio also "
                     "carries the precision gap between sampler and trainer")


def _check_sft(cfg: RLVRConfig, dp: int) -> int:
    sft = cfg.sft_warmup
    if sft is None:
        return 0
    _check_sft_batch(sft, dp, "sft_warmup")
    return sft.steps or 0  # epochs: known once the warm-up's examples are loaded (RunPlan.with_warmup)


def _check_sft_batch(sft, dp: int, section: str) -> None:
    # Packed rows are padded to a multiple of the ranks; one example per row is not, so it must divide.
    if not sft.packing and sft.batch_size % dp:
        raise ConfigError(f"{section}.batch_size={sft.batch_size} must be divisible by the {dp} policy devices (or "
                          f"set {section}.packing=true)")


@dataclass(frozen=True)
class SFTPlan:
    """What a standalone SFT run (``gyre sft``) builds: the policy trainer ranks, one per device."""

    device_kind: DeviceKind
    """cpu or cuda."""
    num_devices: int | None
    """Devices that exist (None: not known until gyre joins the cluster)."""
    roles: dict[str, tuple[int, ...]]
    """{"policy": its devices}: the only role."""
    dp_size: int
    """Data-parallel trainer ranks."""
    threads_per_worker: int
    """Torch threads of each rank (CPU)."""
    steps: int
    """Optimizer steps of the run: sft.steps (dpo.steps), or sft.epochs passes over the examples (pairs)."""
    length: str
    """How the steps were derived, for the plan line ("12 optimizer steps (2 epoch(s) of 48 examples...)")."""
    reference: str | None = None
    """gyre dpo: where the reference log-probs come from (a phrase for ``describe``); None: no reference."""

    def roles_on_device(self, device: int) -> int:
        # gyre dpo's reference role is gone before the policy starts: each holds a whole device in turn.
        return 1

    def worker_devices(self, role: str) -> tuple[tuple[int, ...], ...]:
        """One device per worker."""
        return worker_devices(self.roles[role])

    def describe(self) -> str:
        kind = "GPU" if self.device_kind == "cuda" else "CPU slot"
        text = (f"placement: policy on {kind}s {list(self.roles['policy'])} ({self.dp_size} data-parallel "
                f"rank{'s' * (self.dp_size > 1)}); {self.length}")
        return text + (f"\nreference: {self.reference}" if self.reference else "")


def make_sft_plan(cfg, device_kind: DeviceKind, num_devices: int | None, examples: int) -> SFTPlan:
    """The plan of ``cfg`` (a ``gyre.config.sft_schema.SFTJobConfig``) over ``examples`` loaded examples;
    ConfigError naming the key to change."""
    _check_standalone(cfg, device_kind, num_devices)
    devices = cfg.policy.devices
    _check_sft_batch(cfg.sft, len(devices), "sft")
    return SFTPlan(device_kind, num_devices, {"policy": devices}, len(devices), cfg.cluster.threads_per_slot,
                   cfg.sft.total_steps(examples), cfg.sft.describe_length(examples))


def make_dpo_plan(cfg, device_kind: DeviceKind, num_devices: int | None, pairs: int) -> SFTPlan:
    """The plan of ``cfg`` (a ``gyre.config.dpo_schema.DPOJobConfig``) over ``pairs`` loaded pairs: the policy
    ranks and, for a loss with a reference and no LoRA, a reference role on the same devices that runs
    before them."""
    _check_standalone(cfg, device_kind, num_devices)
    devices, dpo = cfg.policy.devices, cfg.dpo
    if dpo.batch_size % len(devices):
        raise ConfigError(f"dpo.batch_size={dpo.batch_size} must be divisible by the {len(devices)} policy devices "
                          "(each rank trains an equal share of the pairs)")
    roles, reference = {"policy": devices}, None
    if dpo.loss_spec().needs_reference:
        if cfg.policy.lora is None:
            roles["reference"] = devices
            reference = ("a frozen copy of model.path on the same devices computes every pair's log-probs once, "
                         "then gives its memory back before the policy starts")
        else:
            reference = "the policy's own base model, LoRA adapters off, once before training (no second copy)"
    return SFTPlan(device_kind, num_devices, roles, len(devices), cfg.cluster.threads_per_slot,
                   dpo.total_steps(pairs), dpo.describe_length(pairs, "pairs"), reference)


def _check_standalone(cfg, device_kind: DeviceKind, num_devices: int | None) -> None:
    if num_devices is not None:
        check_devices_exist({"policy": cfg.policy.devices}, device_kind, num_devices)
    check_attention(cfg.model.attn_implementation, device_kind)


def _divisors(total: int, multiple_of: int) -> list[int]:
    return [d for d in range(multiple_of, total + 1, multiple_of) if total % d == 0][:8]
