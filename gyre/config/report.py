"""Human-readable report of a resolved config and its placement plan (`gyre check`, run start)."""

from __future__ import annotations

import yaml

from gyre.config.derive import RunPlan
from gyre.config.presets import preset_report, preset_sections_report
from gyre.config.schema import RLVRConfig
from gyre.models.hub import cached_repo_of

_WEIGHT_SYNC = {"none": "none (hybrid: the policy ranks sample with their own weights)",
                "channel": "weight channel: broadcast from the policy's rank 0 in model.dtype",
                "object_store": "Ray object store (through host memory)"}
"""The plan's weight transport as ``gyre check`` names it."""


def resolved_yaml(cfg: RLVRConfig) -> str:
    """The full config with every default filled in, as YAML a user can copy back."""
    data = cfg.model_dump(mode="json")
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None)


def format_plan(cfg: RLVRConfig, plan: RunPlan) -> str:
    kind = "GPU" if plan.device_kind == "cuda" else "CPU slot"
    if plan.num_devices is None:  # planned without counting them (gyre check --plan-only)
        named = len(set().union(*plan.roles.values()))
        lines = [f"placement: {named} {kind}(s) named by the device lists (not counted here), layout {plan.layout}"]
    else:
        lines = [f"placement: {plan.num_devices} {kind}(s) available, layout {plan.layout}"]
    for role, devices in plan.roles.items():
        lines.append(f"  {role:<10} devices {list(devices)}  ({_workers(plan, role)})")
    if plan.hybrid_rollout:
        lines.append("  rollout    inside the policy workers (hybrid)")
    if cfg.env is not None:
        e = cfg.env
        lines.append(f"  env        {e.id}: {e.workers} CPU worker(s) x {e.slots_per_worker} environment(s), "
                     f"up to {e.max_turns} turns of {e.turn_tokens} tokens within {e.context_tokens}; the episode "
                     "return is the reward")
        if e.samples == "step":
            lines.append(f"  samples    one per turn, shown the first observation and {e.history_turns} earlier "
                         f"turn(s); batches padded to a multiple of {plan.rows_multiple} rows")
    for name, d in cfg.reward.domains.items() if cfg.env is None else ():
        routed = "every prompt" if cfg.reward.single else f"tags {cfg.reward.tags_of(name)}"
        share = f", {d.ratio:.0%} of each batch" if d.ratio is not None else ""
        where = (f"{d.workers} CPU worker(s) x {d.processes} process(es)" if d.model_role is None
                 else f"the {d.model_role}.{name} role (above)")
        lines.append(f"  reward     {name}: {d.type} on {routed}{share}; {where}")
    for (a, b), devices in plan.shared_devices.items():
        how = "time-shared with offload" if plan.offload else "time-shared"
        lines.append(f"  {a} and {b} share {kind}s {list(devices)}: {how}")
    lines += [
        "derived:",
        _model_line(cfg),
        f"  rollout batch        {plan.rollout_batch} samples = {cfg.rollout.prompts_per_step} prompts x "
        f"{cfg.rollout.samples_per_prompt} samples",
        f"  data parallel        {plan.dp_size} rank(s), {cfg.policy.strategy}",
        f"  mini-batch           {plan.mini_batch_size} samples -> {plan.optimizer_steps_per_step} optimizer "
        f"step(s) per RL step ({cfg.policy.epochs} epoch(s))",
        _per_rank_line(cfg, plan),
        f"  total                {cfg.run.steps} RL steps, {plan.total_optimizer_steps} optimizer steps"
        + (f", after an SFT warm-up of {plan.sft_length or f'{plan.sft_steps} steps'}" if plan.sft_steps else ""),
        f"  old log-probs        {'recomputed' if plan.recompute_old_logprobs else 'not recomputed'}",
        f"  weight sync          {_WEIGHT_SYNC[plan.weight_transport]}",
        f"  reference model      {_reference(plan)}",
        _critic_line(cfg, plan),
        f"  teacher model        {_teacher(cfg, plan)}",
    ]
    if cfg.policy.lora is not None:
        lines.append(_lora_line(cfg))
    lines += _algorithm_lines(cfg, plan)
    if plan.overlong_cache_tokens:
        lines.append(f"  overlong penalty     L_max {cfg.rollout.sampling.max_new_tokens}, L_cache "
                     f"{plan.overlong_cache_tokens} tokens")
    lines += _memory_lines(cfg, plan)
    if plan.memory:
        lines += ["memory per device (estimate: gyre.config.memory):", *plan.memory]
    lines += preset_report(cfg.algorithm)
    lines += preset_sections_report(cfg)
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


def _workers(plan: RunPlan, role: str) -> str:
    """How many workers a role has: one per device, or the rollout's tensor-parallel engines."""
    if role == "rollout" and plan.rollout_tp > 1:
        groups = ", ".join(str(list(d)) for d in plan.worker_devices(role))
        return f"{plan.rollout_workers} engines x TP {plan.rollout_tp}: {groups}"
    return f"{len(plan.roles[role])} worker(s)"


def _algorithm_lines(cfg: RLVRConfig, plan: RunPlan) -> list[str]:
    """The estimator, the policy loss with the knobs its variant reads, the KL loss and the mismatch correction."""
    a = cfg.algorithm
    adv, loss = a.advantage, a.loss
    estimator = adv.estimator + (f" (k={adv.pass_at_k.k})" if adv.estimator == "pass_at_k" else "")
    lines = [f"  advantages           {estimator}, rewards normalised by mean {adv.norm_mean} / std {adv.norm_std}"
             + (", whitened" if adv.whiten else "")
             + (f"; credit {a.credit.strategy} (gamma {a.credit.gamma_amp:g} on the top {a.credit.top_q:.0%})"
                if a.credit.strategy != "none" else "")]
    if adv.row.greedy:
        lines.append("  greedy baseline      + 1 greedy sample per prompt (temperature 0), scored, used as the "
                     "baseline, never trained")
    ratio = f"{loss.ratio_level} ratio" if loss.row.has_ratio else "no ratio"
    own = getattr(loss, loss.variant) if loss.row.knobs is not None else None
    knobs = [f"{k}={getattr(loss, k)}" for k in loss.row.shared]
    knobs += [f"{loss.variant}.{k}={getattr(own, k)}" for k in type(own).model_fields] if own is not None else []
    how = ratio + (f"; {', '.join(knobs)}" if knobs else "")
    lines.append(f"  policy loss          {loss.variant} ({how}), aggregated {loss.agg}"
                 + (f" / {plan.loss_agg_norm}" if plan.loss_agg_norm else ""))
    if a.kl.loss_coef > 0:
        grad = a.kl.loss_grad_estimator
        lines.append(f"  KL loss              {a.kl.loss_coef:g} x {a.kl.loss_estimator}"
                     + (f" in value, {grad} in gradient (straight-through)" if grad and grad != a.kl.loss_estimator
                        else ""))
    m = a.mismatch
    if m.enabled:
        parts = []
        if m.weight != "none":
            parts.append(f"{m.weight} weights <= {m.upper_bound:g}" + (", batch-normalised" if m.normalize_weights
                                                                       else ""))
        if m.filter != "none":
            parts.append(f"{m.filter} ratio filter [{m.ratio_low:g}, {m.ratio_high:g}]")
        if m.divergence != "none":
            parts.append(f"{m.divergence} divergence rejection, {m.divergence_level} <= {m.divergence_max:g}")
        lines.append(f"  mismatch             {'; '.join(parts)}")
    return lines


def _model_line(cfg: RLVRConfig) -> str:
    """Where the model came from (a Hub id: its cached commit) and the dtypes it computes and is saved in."""
    m = cfg.model
    cached = cached_repo_of(m.path)
    source = f"{cached[0]} at commit {cached[1][:12]} (Hugging Face cache: {m.path})" if cached else m.path
    attention = f", attention {m.attn_implementation}" if m.attn_implementation else ""
    saved = "the dtype it is stored in" if m.save_dtype == "auto" else m.save_dtype  # auto: a model not here
    return f"  model                {source}; computes in {m.dtype}{attention}, final model saved in {saved}"


def _critic_line(cfg: RLVRConfig, plan: RunPlan) -> str:
    """No critic, PPO's one, or AsyPPO's several: how they split the data and what their disagreement masks."""
    head = "  critic               "
    if not plan.use_critic:
        return head + "no"
    if len(plan.critic_roles) == 1:
        return head + f"{plan.critic_dp_size} rank(s)"
    a, c = cfg.algorithm.critic, cfg.critic
    division = ("each an equal share of every prompt's responses" if a.data_division == "group_response_split"
                else "each whole prompts (prompt shards)")
    return (head + f"{c.num_critics} critics of {plan.critic_dp_size} rank(s) ({', '.join(plan.critic_roles)}), "
            f"{division}; GAE on their {a.value_aggregation} value; advantages masked on the "
            f"{a.adv_mask_low_pct:.0%} of tokens where they agree most, entropy term filtered on the "
            f"{a.entropy_filter_high_pct:.0%} where they disagree most")


def _reference(plan: RunPlan) -> str:
    if not plan.use_reference:
        return "no (no KL term)"
    return "the base model: LoRA adapters off, on the policy ranks" if plan.reference_on_policy else "yes"


def _teacher(cfg: RLVRConfig, plan: RunPlan) -> str:
    if not plan.use_teacher:
        return "no (no distillation)"
    d = cfg.algorithm.distill
    return (f"{cfg.teacher.model_path}, on devices {list(cfg.teacher.devices)}; distill.mode {d.mode}, "
            f"distill.coef {d.coef:g}")


def _lora_line(cfg: RLVRConfig) -> str:
    """LoRA's shape and what it trains, counted on the model's architecture (no weight is loaded) once
    model.path is a local model directory (pre-flight resolves it)."""
    from pathlib import Path

    lora = cfg.policy.lora.spec()
    saved = f" + {list(lora.modules_to_save)} in full" if lora.modules_to_save else ""
    targets = lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
    counted = f"{targets} layers{saved}"
    if (Path(cfg.model.path) / "config.json").is_file():
        from gyre.models.lora import lora_size

        size = lora_size(cfg.model.path, lora, cfg.model.trust_remote_code)
        counted = (f"{size.layers} {counted}: {size.trainable:,} of {size.total:,} parameters train "
                   f"({100 * size.trainable / size.total:.2f}%)")
    return (f"  LoRA                 r={lora.r}, alpha={lora.alpha:g} (scale {lora.scale:g}) on {counted}; "
            f"optimizer state, checkpoints and weight syncs hold the adapters alone; final model {lora.save}")


def _per_rank_line(cfg: RLVRConfig, plan: RunPlan) -> str:
    head = f"  per rank             {plan.samples_per_rank} samples in "
    if cfg.policy.micro_batch_tokens:
        return head + f"micro-batches of <= {cfg.policy.micro_batch_tokens} tokens (as many as the lengths need)"
    return head + f"{plan.micro_batches_per_rank} micro-batch(es) of <= {cfg.policy.micro_batch_size}"


def _memory_lines(cfg: RLVRConfig, plan: RunPlan) -> list[str]:
    """The memory levers of each model role that runs, and gradient checkpointing."""
    checkpointing = f"; gradient checkpointing {'on' if cfg.model.gradient_checkpointing else 'off'}"
    roles = [("policy", cfg.policy, True, checkpointing)]
    if plan.use_reference:
        roles.append(("reference", cfg.reference, True, ""))
    if plan.use_teacher:
        roles.append(("teacher", cfg.teacher, True, ""))
    if plan.use_critic:
        roles.append(("critic", cfg.critic, False, checkpointing))
    return [f"  {f'memory ({name})':<20} {section.levers.describe(section.micro_batch_size, logprobs)}{extra}"
            for name, section, logprobs, extra in roles]
