"""Other frameworks' names for gyre's config keys, for the "did you mean" of an unknown key; and gyre's own
keys that moved, which load at their new place.

Users arrive with TRL's ``num_generations``, verl's ``actor_rollout_ref.rollout.n`` or OpenRLHF's
``--n_samples_per_prompt`` in their fingers; the strict config rejects those keys, and this table lets
the error name gyre's key instead of a spelling neighbour. Where the meaning differs (a batch counted in
prompts instead of samples, a second key to set), the note says so.

A key gyre itself moved with its meaning unchanged (``algorithm.cispo_low`` is now
``algorithm.loss.cispo.low``) is an alias with ``moved``: loading rewrites it to the new key
(``move_renamed``) and says so once per key, instead of refusing it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Alias:
    key: str
    """gyre's key, as a user writes it (the single reward domain in its short form, reward.*)."""
    origin: str
    """Whose name this is: TRL, verl, OpenRLHF or ROLL (or an earlier gyre, for a key it replaced)."""
    note: str = ""
    """How gyre's key differs, when it does."""
    moved: bool = False
    """gyre's own key, moved with its meaning unchanged: loading rewrites it to ``key``, with a notice."""


_SAMPLES = "rollout.samples_per_prompt"
_NEW_TOKENS = "rollout.sampling.max_new_tokens"
_PROMPT_TOKENS = "data.max_prompt_tokens"
_PROMPTS_NOTE = "gyre counts prompts; the batch is prompts_per_step x samples_per_prompt samples"
_MINI_NOTE = "gyre counts samples (prompts x samples_per_prompt) per optimizer step, across all ranks"
_MICRO_NOTE = "samples per forward/backward pass on one rank"
_TP_NOTE = ("GPUs per vLLM rollout engine; the trainers do not split layers (policy.strategy=fsdp2 shards "
            "parameters)")

# Matched against the whole dotted path of the unknown key (its leaves, under an unknown section).
BY_PATH: dict[str, Alias] = {
    "rollout.n": Alias(_SAMPLES, "verl"),
    "actor_rollout_ref.rollout.n": Alias(_SAMPLES, "verl"),
    "data.train_batch_size": Alias("rollout.prompts_per_step", "verl"),
    "actor_rollout_ref.model.path": Alias("model.path", "verl"),
    "critic.model.path": Alias("critic.model_path", "verl"),
    "reward_model.model.path": Alias("reward.reward_model.path", "verl", "with reward.type=reward_model"),
    "critic.optim.lr": Alias("critic.optimizer.lr", "verl"),
    "algorithm.kl_ctrl.kl_coef": Alias("algorithm.kl.reward_coef", "verl"),
    "algorithm.kl_ctrl.target_kl": Alias("algorithm.kl.target", "verl"),
    "actor_rollout_ref.rollout.name": Alias("rollout.backend", "verl"),
    "actor_rollout_ref.rollout.gpu_memory_utilization": Alias("rollout.gpu_memory_utilization", "verl"),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": Alias("rollout.tensor_parallel_size", "verl",
                                                                  "GPUs per vLLM rollout engine"),
    "custom_reward_function.path": Alias("reward.function", "verl",
                                         "with reward.type=function: reward.function=FILE.py:NAME names the file "
                                         "and the function together"),
    "custom_reward_function.name": Alias("reward.function", "verl",
                                         "with reward.type=function: reward.function=FILE.py:NAME names the file "
                                         "and the function together"),
    "trainer.nnodes": Alias("cluster.address", "verl",
                            "gyre joins a Ray cluster (cluster.address) and places each role on the devices its "
                            "devices list names, on any node: no node count to set"),
    "trainer.n_gpus_per_node": Alias("policy.devices", "verl",
                                     "gyre lists each role's devices (policy.devices, rollout.devices, ...): "
                                     "devices=[0, 1, 2, 3] for four GPUs"),
    # TRL's SFTConfig, under gyre's SFT sections (elsewhere max_steps is the RL run's length)
    "sft.num_train_epochs": Alias("sft.epochs", "TRL"),
    "sft.max_steps": Alias("sft.steps", "TRL"),
    "sft_warmup.num_train_epochs": Alias("sft_warmup.epochs", "TRL"),
    "sft_warmup.max_steps": Alias("sft_warmup.steps", "TRL"),
    # gyre's own keys that were replaced
    "logging.tensorboard": Alias("logging.trackers", "earlier gyre",
                                 "logging.trackers=[tensorboard] writes TensorBoard, logging.trackers=[] nothing but "
                                 "metrics.jsonl"),
}

# The flat algorithm section of earlier gyre, in sub-sections since (issue 22): old key -> new key.
_ALGORITHM_MOVES = {
    "estimator": "advantage.estimator", "norm_mean": "advantage.norm_mean", "norm_std": "advantage.norm_std",
    "std_eps": "advantage.std_eps", "std_ddof": "advantage.std_ddof", "reward_clip": "advantage.reward_clip",
    "gamma": "advantage.gamma", "lam": "advantage.gae.lam", "gigpo_step_gamma": "advantage.gigpo.step_gamma",
    "gigpo_episode_weight": "advantage.gigpo.episode_weight", "gigpo_step_weight": "advantage.gigpo.step_weight",
    "pass_k": "advantage.pass_at_k.k", "whiten_advantages": "advantage.whiten", "advantage_clip": "advantage.clip",
    "policy_loss": "loss.variant", "ratio_level": "loss.ratio_level", "clip_low": "loss.clip_low",
    "clip_high": "loss.clip_high", "dual_clip_c": "loss.ppo.dual_clip_c", "tis_low": "loss.tis.low",
    "tis_high": "loss.tis.high", "topr_positive_weight": "loss.topr.positive_weight",
    "topr_negative_weight": "loss.topr.negative_weight", "cispo_low": "loss.cispo.low",
    "cispo_high": "loss.cispo.high", "cispo_unified_mask": "loss.cispo.unified_mask", "kimi15_tau": "loss.kimi15.tau",
    "behaviour_cap": "loss.decoupled_ppo.behaviour_cap", "clip_cov_ratio": "loss.clip_cov.ratio",
    "clip_cov_lb": "loss.clip_cov.lb", "clip_cov_ub": "loss.clip_cov.ub", "kl_cov_ratio": "loss.kl_cov.ratio",
    "kl_cov_coef": "loss.kl_cov.coef", "gmpo_clip_low": "loss.gmpo.clip_low", "gmpo_clip_high": "loss.gmpo.clip_high",
    "sapo_tau_pos": "loss.sapo.tau_pos", "sapo_tau_neg": "loss.sapo.tau_neg", "loss_agg": "loss.agg",
    "loss_agg_norm": "loss.agg_norm", "entropy_coef": "loss.entropy_coef",
    "kl_loss_coef": "kl.loss_coef", "kl_loss_estimator": "kl.loss_estimator",
    "kl_loss_grad_estimator": "kl.loss_grad_estimator", "kl_clamp": "kl.clamp", "kl_reward_coef": "kl.reward_coef",
    "kl_reward_estimator": "kl.reward_estimator", "kl_target": "kl.target", "kl_horizon": "kl.horizon",
    "overlong_mask": "masks.overlong", "overlong_penalty_frac": "masks.overlong_penalty_frac",
    "difficulty_mask": "masks.difficulty",
    "value_clip": "critic.value_clip", "critic_warmup": "critic.warmup",
    "value_aggregation": "critic.value_aggregation",
    "critic_data_division": "critic.data_division", "adv_mask_low_pct": "critic.adv_mask_low_pct",
    "entropy_filter_high_pct": "critic.entropy_filter_high_pct",
    "distill_coef": "distill.coef", "distill_mode": "distill.mode",
}
BY_PATH.update({f"algorithm.{old}": Alias(f"algorithm.{new}", "earlier gyre", moved=True)
                for old, new in _ALGORITHM_MOVES.items()})

# Matched against the last part of the unknown key's path, wherever it was written.
BY_NAME: dict[str, Alias] = {
    # TRL (GRPOConfig, its TrainingArguments and ModelConfig)
    "num_generations": Alias(_SAMPLES, "TRL"),
    "per_device_train_batch_size": Alias("policy.micro_batch_size", "TRL", _MICRO_NOTE),
    "gradient_accumulation_steps": Alias("policy.mini_batch_size", "TRL",
                                         "gyre sets the samples per optimizer step; micro-batches accumulate to it"),
    "generation_batch_size": Alias("rollout.prompts_per_step", "TRL", _PROMPTS_NOTE),
    "steps_per_generation": Alias("policy.mini_batch_size", "TRL",
                                  "optimizer steps per rollout batch = rollout batch / policy.mini_batch_size"),
    "learning_rate": Alias("policy.optimizer.lr", "TRL"),
    "max_completion_length": Alias(_NEW_TOKENS, "TRL"),
    "max_prompt_length": Alias(_PROMPT_TOKENS, "TRL, verl"),
    "filter_overlong_prompts": Alias("data.overlong_prompts", "verl", "data.overlong_prompts=drop"),
    "truncation": Alias("data.overlong_prompts", "verl", "error, drop or truncate_left"),
    "reward_fn_key": Alias("data.tag_key", "verl"),
    "beta": Alias("algorithm.kl.loss_coef", "TRL"),
    "epsilon": Alias("algorithm.loss.clip_low", "TRL"),
    "epsilon_high": Alias("algorithm.loss.clip_high", "TRL"),
    "num_iterations": Alias("policy.epochs", "TRL"),
    "loss_type": Alias("algorithm.loss.agg", "TRL", "or a whole recipe with algorithm.preset, e.g. dr_grpo"),
    "scale_rewards": Alias("algorithm.advantage.norm_std", "TRL", "group, batch or none"),
    "mask_truncated_completions": Alias("algorithm.masks.overlong", "TRL"),
    "importance_sampling_level": Alias("algorithm.loss.ratio_level", "TRL"),
    "max_steps": Alias("run.steps", "TRL, ROLL"),
    "run_name": Alias("run.name", "TRL"),
    "max_grad_norm": Alias("policy.grad_clip", "TRL"),
    "lr_scheduler_type": Alias("policy.scheduler.type", "TRL"),
    "save_steps": Alias("checkpoint.every", "TRL, OpenRLHF"),
    "save_total_limit": Alias("checkpoint.keep_last", "TRL"),
    "eval_steps": Alias("validation.every", "TRL, OpenRLHF"),
    "bf16": Alias("model.dtype", "TRL, OpenRLHF", "model.dtype=bfloat16"),
    "fp16": Alias("model.dtype", "TRL", "model.dtype=float16"),
    "torch_dtype": Alias("model.dtype", "TRL", "the saved model's dtype is model.save_dtype"),
    "model_name_or_path": Alias("model.path", "TRL"),
    "model_revision": Alias("model.revision", "TRL"),
    "padding_free": Alias("policy.remove_padding", "TRL", "remove_padding=pack"),
    "report_to": Alias("logging.trackers", "TRL", "a list of tensorboard, wandb, mlflow, trackio"),
    # verl (leaf names under actor_rollout_ref, algorithm, trainer)
    "ppo_mini_batch_size": Alias("policy.mini_batch_size", "verl", _MINI_NOTE + "; verl counts prompts"),
    "ppo_micro_batch_size_per_gpu": Alias("policy.micro_batch_size", "verl", _MICRO_NOTE),
    "log_prob_micro_batch_size_per_gpu": Alias("reference.micro_batch_size", "verl"),
    "ppo_epochs": Alias("policy.epochs", "verl, ROLL"),
    "clip_ratio": Alias("algorithm.loss.clip_low", "verl", "and algorithm.loss.clip_high"),
    "clip_ratio_low": Alias("algorithm.loss.clip_low", "verl"),
    "clip_ratio_high": Alias("algorithm.loss.clip_high", "verl"),
    "clip_ratio_c": Alias("algorithm.loss.ppo.dual_clip_c", "verl"),
    "loss_agg_mode": Alias("algorithm.loss.agg", "verl"),
    "kl_loss_type": Alias("algorithm.kl.loss_estimator", "verl"),
    "use_kl_loss": Alias("algorithm.kl.loss_coef", "verl, OpenRLHF", "a coefficient > 0 turns the KL loss on"),
    "use_kl_in_reward": Alias("algorithm.kl.reward_coef", "verl", "a coefficient > 0 turns the KL penalty on"),
    "entropy_coeff": Alias("algorithm.loss.entropy_coef", "verl"),
    "adv_estimator": Alias("algorithm.advantage.estimator", "verl, ROLL", "or a whole recipe with algorithm.preset"),
    "norm_adv_by_std_in_grpo": Alias("algorithm.advantage.norm_std", "verl", "group or none"),
    "enable_gradient_checkpointing": Alias("model.gradient_checkpointing", "verl"),
    "use_remove_padding": Alias("policy.remove_padding", "verl", "sort or pack"),
    "use_dynamic_bsz": Alias("policy.micro_batch_tokens", "verl", "setting the token budget turns it on"),
    "ppo_max_token_len_per_gpu": Alias("policy.micro_batch_tokens", "verl"),
    "log_prob_max_token_len_per_gpu": Alias("reference.micro_batch_tokens", "verl"),
    "max_response_length": Alias(_NEW_TOKENS, "verl"),
    "total_training_steps": Alias("run.steps", "verl"),
    "save_freq": Alias("checkpoint.every", "verl"),
    "test_freq": Alias("validation.every", "verl"),
    "default_local_dir": Alias("run.output_dir", "verl"),
    "experiment_name": Alias("run.name", "verl"),
    "max_actor_ckpt_to_keep": Alias("checkpoint.keep_last", "verl"),
    "loss_mode": Alias("algorithm.loss.variant", "verl", "verl's geo_mean is gmpo; its gpg loss is vanilla"),
    "tau_pos": Alias("algorithm.loss.sapo.tau_pos", "verl"),
    "tau_neg": Alias("algorithm.loss.sapo.tau_neg", "verl"),
    "ppo_kl_coef": Alias("algorithm.loss.kl_cov.coef", "verl"),
    "k_percent": Alias("algorithm.loss.kl_cov.ratio", "Entropy-Mechanism-of-RL",
                       "a share, not a percentage: 0.2 is 0.002"),
    "rollout_is_batch_normalize": Alias("algorithm.mismatch.normalize_weights", "verl"),
    # OpenRLHF (command-line flags)
    "n_samples_per_prompt": Alias(_SAMPLES, "OpenRLHF"),
    "rollout_batch_size": Alias("rollout.prompts_per_step", "OpenRLHF, ROLL", _PROMPTS_NOTE),
    "train_batch_size": Alias("policy.mini_batch_size", "OpenRLHF", _MINI_NOTE),
    "micro_train_batch_size": Alias("policy.micro_batch_size", "OpenRLHF", _MICRO_NOTE),
    "packing_samples": Alias("policy.remove_padding", "OpenRLHF", "remove_padding=pack"),
    "micro_rollout_batch_size": Alias("rollout.max_batch_size", "OpenRLHF", "sequences one engine decodes at once"),
    "max_epochs": Alias("policy.epochs", "OpenRLHF"),
    "prompt_max_len": Alias(_PROMPT_TOKENS, "OpenRLHF"),
    "generate_max_len": Alias(_NEW_TOKENS, "OpenRLHF"),
    "pretrain": Alias("model.path", "OpenRLHF, ROLL"),
    "critic_pretrain": Alias("critic.model_path", "OpenRLHF"),
    "reward_pretrain": Alias("reward.reward_model.path", "OpenRLHF", "with reward.type=reward_model"),
    "actor_learning_rate": Alias("policy.optimizer.lr", "OpenRLHF"),
    "critic_learning_rate": Alias("critic.optimizer.lr", "OpenRLHF"),
    "init_kl_coef": Alias("algorithm.kl.reward_coef", "OpenRLHF, ROLL",
                          "with OpenRLHF's --use_kl_loss it is algorithm.kl.loss_coef"),
    "kl_estimator": Alias("algorithm.kl.loss_estimator", "OpenRLHF"),
    "eps_clip": Alias("algorithm.loss.clip_low", "OpenRLHF", "and algorithm.loss.clip_high"),
    "eps_clip_low_high": Alias("algorithm.loss.clip_low", "OpenRLHF", "and algorithm.loss.clip_high"),
    "lambd": Alias("algorithm.advantage.gae.lam", "OpenRLHF"),
    "advantage_estimator": Alias("algorithm.advantage.estimator", "OpenRLHF",
                                 "or a whole recipe with algorithm.preset"),
    "entropy_loss_coef": Alias("algorithm.loss.entropy_coef", "OpenRLHF"),
    "save_path": Alias("run.output_dir", "OpenRLHF"),
    "max_ckpt_num": Alias("checkpoint.keep_last", "OpenRLHF"),
    "prompt_data": Alias("data.train_files", "OpenRLHF"),
    "input_key": Alias("data.prompt_key", "OpenRLHF"),
    "label_key": Alias("data.answer_key", "OpenRLHF"),
    "apply_chat_template": Alias("data.chat_template", "OpenRLHF"),
    "zero_stage": Alias("policy.strategy", "OpenRLHF", "fsdp2 shards parameters, gradients and optimizer state"),
    "flash_attn": Alias("model.attn_implementation", "OpenRLHF", "model.attn_implementation=flash_attention_2"),
    "dynamic_filtering": Alias("rollout.dynamic_sampling", "OpenRLHF"),
    "dynamic_filtering_reward_range": Alias("rollout.dynamic_sampling.mean_range", "OpenRLHF"),
    "adam_betas": Alias("policy.optimizer.betas", "OpenRLHF"),
    "l2": Alias("policy.optimizer.weight_decay", "OpenRLHF"),
    "max_norm": Alias("policy.grad_clip", "OpenRLHF"),
    "vllm_num_engines": Alias("rollout.devices", "OpenRLHF", "one engine per device"),
    "use_vllm": Alias("rollout.backend", "TRL", "use_vllm=true is rollout.backend=vllm"),
    "vllm_mode": Alias("rollout.mode", "TRL", "server is rollout.backend=vllm with rollout.devices apart from "
                       "policy.devices; colocate is the same engines on the policy's devices (rollout.devices = "
                       "policy.devices, time-shared), or rollout.mode=hybrid (the policy ranks sample, HF engine)"),
    "async_train": Alias("rollout.async_ratio", "OpenRLHF", "a ratio > 0 overlaps rollout with training"),
    "tensor_model_parallel_size": Alias("rollout.tensor_parallel_size", "verl, Megatron", _TP_NOTE),
    "tensor_parallel_size": Alias("rollout.tensor_parallel_size", "vLLM, ROLL", _TP_NOTE),
    "vllm_tensor_parallel_size": Alias("rollout.tensor_parallel_size", "OpenRLHF, TRL", _TP_NOTE),
    "gpu_memory_utilization": Alias("rollout.gpu_memory_utilization", "verl, vLLM", "the share of its GPU an "
                                    "engine may fill"),
    "vllm_gpu_memory_utilization": Alias("rollout.gpu_memory_utilization", "TRL, OpenRLHF", "the share of its GPU "
                                         "an engine may fill"),
    "max_num_batched_tokens": Alias("rollout.max_prefill_tokens", "vLLM, verl", "tokens one prefill pass may hold"),
    "max_num_seqs": Alias("rollout.max_batch_size", "vLLM, verl", "sequences one engine decodes at once"),
    # LoRA (TRL's ModelConfig / peft, verl's actor_rollout_ref.model, OpenRLHF's flags)
    "use_peft": Alias("policy.lora", "TRL", "policy.lora={} turns LoRA on"),
    "lora_r": Alias("policy.lora.r", "TRL"),
    "lora_rank": Alias("policy.lora.r", "verl, OpenRLHF", "a rank > 0 is policy.lora={r: rank}"),
    "lora_alpha": Alias("policy.lora.alpha", "TRL, verl, OpenRLHF, peft"),
    "lora_dropout": Alias("policy.lora.dropout", "TRL, OpenRLHF, peft"),
    "lora_target_modules": Alias("policy.lora.target_modules", "TRL"),
    "lora_modules_to_save": Alias("policy.lora.modules_to_save", "TRL"),
    "use_rslora": Alias("policy.lora.rslora", "TRL, peft"),
    # verl's rollout correction (algorithm.rollout_correction.*): the direction of each ratio matters
    "rollout_is": Alias("algorithm.mismatch.weight", "verl", "token, segment, geometric or sequence"),
    "rollout_is_threshold": Alias("algorithm.mismatch.upper_bound", "verl", "the same ratio, pi_old / mu"),
    "rollout_rs": Alias("algorithm.mismatch.filter", "verl",
                        "gyre bounds pi_old / mu; verl's *_k1 modes bound mu / pi_old. The *_k2 / *_k3 modes are "
                        "algorithm.mismatch.divergence: seq_mean_k3 is divergence=k3, divergence_level=sequence_mean"),
    "rollout_rs_threshold": Alias("algorithm.mismatch.ratio_high", "verl",
                                  "and ratio_low, bounds on pi_old / mu; a *_k1 threshold lo_hi bounds "
                                  "mu / pi_old: write ratio_low=1/hi, ratio_high=1/lo. For *_k2 / *_k3 it is "
                                  "algorithm.mismatch.divergence_max"),
    "rollout_rs_threshold_lower": Alias("algorithm.mismatch.ratio_low", "verl", "a bound on pi_old / mu"),
    # ROLL (the reference design)
    "num_return_sequences_in_group": Alias(_SAMPLES, "ROLL"),
    "async_generation_ratio": Alias("rollout.async_ratio", "ROLL"),
    "response_length": Alias(_NEW_TOKENS, "ROLL"),
    "prompt_length": Alias(_PROMPT_TOKENS, "ROLL"),
}


def _trainer_names(section: str, unit: str) -> dict[str, Alias]:
    """TRL's TrainingArguments names in a standalone trainer run (gyre sft, gyre dpo), whose optimisation
    keys live in ``section``; ``unit`` is what its batches count."""
    return {
        "per_device_train_batch_size": Alias(f"{section}.micro_batch_size", "TRL",
                                             f"{unit} per forward/backward pass on one rank"),
        "gradient_accumulation_steps": Alias(f"{section}.batch_size", "TRL", f"gyre sets the {unit} per optimizer "
                                             "step across all ranks; micro-batches accumulate to it"),
        "learning_rate": Alias(f"{section}.optimizer.lr", "TRL"),
        "max_steps": Alias(f"{section}.steps", "TRL"),
        "num_train_epochs": Alias(f"{section}.epochs", "TRL"),
        "max_grad_norm": Alias(f"{section}.grad_clip", "TRL"),
        "lr_scheduler_type": Alias(f"{section}.scheduler.type", "TRL"),
        "max_length": Alias(f"{section}.max_tokens", "TRL"),
        "save_steps": Alias("run.output_dir", "TRL", f"gyre {section} keeps no checkpoints: it writes final_model/"),
    }


_WHOLE = "gyre bounds each whole sequence (prompt + completion)"
BY_PIPELINE: dict[str, dict[str, Alias]] = {
    "sft": {**_trainer_names("sft", "examples"), "max_seq_length": Alias("sft.max_tokens", "TRL")},
    "dpo": {
        **_trainer_names("dpo", "pairs"),
        # gyre's own key names, listed because BY_NAME points them at the RL config's keys.
        "beta": Alias("dpo.beta", "TRL"),
        "loss_type": Alias("dpo.loss_type", "TRL"),
        "reference_free": Alias("dpo.loss_type", "TRL", "dpo.loss_type=simpo is the reference-free variant"),
        "max_prompt_length": Alias("dpo.max_tokens", "TRL", _WHOLE),
        "max_completion_length": Alias("dpo.max_tokens", "TRL", _WHOLE),
        "truncation_mode": Alias("dpo.overlong", "TRL", "dpo.overlong=truncate keeps each sequence's start"),
    },
}
"""Names whose gyre key differs in a standalone run (by its ``pipeline``), checked before ``BY_NAME``."""


# Values gyre renamed, by key (the section's dotted path and the key): the old value -> what to write now.
RENAMED_VALUES: dict[str, dict[str, str]] = {
    "algorithm.advantage.estimator": {
        "reinforce_pp_baseline": "was renamed group_centred_batch_std (the group-centred reward over the batch "
                                 "std of the centred rewards, per response); the paper's REINFORCE++-baseline, "
                                 "normalised over tokens after the KL penalty, is algorithm.preset="
                                 "reinforce_pp_baseline",
    },
}


def renamed_value(section: object, path: str) -> str | None:
    """The message for a value of ``section`` (the raw mapping at dotted ``path``, its sub-sections included)
    that gyre renamed, if any."""
    for dotted, renames in RENAMED_VALUES.items():
        where, _, key = dotted.rpartition(".")
        if where != path and not where.startswith(path + "."):
            continue
        node = section
        for part in where.split(".")[path.count(".") + 1:]:
            node = node.get(part) if isinstance(node, dict) else None
        value = node.get(key) if isinstance(node, dict) else None
        if isinstance(value, str) and value in renames:
            return f"{dotted}={value} {renames[value]}"
    return None


_ANNOUNCED: set[str] = set()
"""The moved keys already announced in this process (a notice is printed once per key)."""


def announce_move(old: str, new: str) -> None:
    """The one-line notice of a moved key, once per key and process, on stderr (stdout may be a report)."""
    if old not in _ANNOUNCED:
        _ANNOUNCED.add(old)
        print(f"note: config key {old} -> {new} (renamed; write the new key, the old one still loads)",
              file=sys.stderr)


def move_renamed(section: object, path: str, announce: Callable[[str, str], None] = announce_move) -> object:
    """``section`` (the raw mapping at dotted ``path``) with each key gyre moved (a ``moved`` alias) written at
    its new place, ``{"cispo_low": 0.2}`` at ``algorithm`` becoming ``{"loss": {"cispo": {"low": 0.2}}}``, and
    each move announced. The mapping given is not changed. A key written both ways is a ValueError."""
    if not isinstance(section, dict):
        return section
    out = dict(section)
    for key in section:
        alias = BY_PATH.get(f"{path}.{key}")
        if alias is None or not alias.moved:
            continue
        old = f"{path}.{key}"
        *parents, leaf = alias.key.removeprefix(path + ".").split(".")
        node = out
        for part in parents:
            child = node.get(part)
            if child is not None and not isinstance(child, dict):
                raise ValueError(f"{old} was renamed {alias.key}, but {part} is written as a value, not a section")
            node[part] = dict(child or {})  # a copy: the caller's mapping stays as written
            node = node[part]
        if leaf in node:
            raise ValueError(f"{old} was renamed {alias.key}, and both are written: keep {alias.key}")
        node[leaf] = out.pop(key)
        announce(old, alias.key)
    return out


def moved_close_to(path: str) -> Alias | None:
    """The moved key whose old name is closest in spelling to the unknown key at dotted ``path``
    (``algorithm.kl_los_coef`` -> the alias of algorithm.kl_loss_coef), if any is close."""
    import difflib

    where, _, name = path.rpartition(".")
    olds = {k.rpartition(".")[2]: a for k, a in BY_PATH.items() if a.moved and k.rpartition(".")[0] == where}
    close = difflib.get_close_matches(name, list(olds), n=1, cutoff=0.8)
    return olds[close[0]] if close else None


def alias_for(path: str, pipeline: str | None = None) -> tuple[str, Alias] | None:
    """(the foreign name matched, gyre's key for it) for the unknown key at dotted ``path`` of a
    ``pipeline`` config: by its whole path, else by its last part."""
    if path in BY_PATH:
        return path, BY_PATH[path]
    name = path.rpartition(".")[2]
    own = BY_PIPELINE.get(pipeline or "", {})
    if name in own:
        return name, own[name]
    return (name, BY_NAME[name]) if name in BY_NAME else None


def describe(name: str, alias: Alias) -> str:
    """'(verl: actor_rollout_ref.rollout.n)', with the note when the meanings differ."""
    note = f"; {alias.note}" if alias.note else ""
    return f"({alias.origin}: {name}{note})"
