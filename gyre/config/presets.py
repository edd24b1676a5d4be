"""Named algorithm presets: each expands to explicit ``algorithm`` knobs, which a user may override.

A preset is only a starting set of values; the resolved config (``gyre check``) shows every knob, and
any key written next to ``preset`` wins over the preset's value. A preset sets every knob its paper
fixes, schema defaults included where the paper differs from them (no paper here uses dual clip, so
each PPO-loss preset turns the schema's c = 3 off: loss.ppo.dual_clip_c null);
``tests/config/test_preset_papers.py`` checks each expansion against its paper's list. Sources, with the
deviations we chose:

- grpo: DeepSeekMath (arXiv 2402.03300); ROLL's GRPO preset (k3 KL loss 0.001, seq-mean-token-mean).
  Deviation: the paper's KL coefficient is 0.04; 0.001 is ROLL's and verl's (algorithms.md section 11).
- dr_grpo: "Understanding R1-Zero-Like Training" (arXiv 2503.20783): group mean, no std, and a constant
  length normaliser (seq-mean-token-sum-norm; the constant defaults to rollout.sampling.max_new_tokens).
- dapo: DAPO (arXiv 2503.14476): clip-higher 0.28, token-mean, overlong filtering and soft punishment
  (L_cache = 20% of max_new_tokens, the paper's 4096 / 20480). Dynamic sampling is the difficulty mask
  (0, 1): groups with no reward variance leave the loss; refilling the batch belongs to the scheduler.
- lite_ppo: "Tricks or Traps" (arXiv 2508.08221): group mean with batch std, token-mean, vanilla clip.
- ppo: PPO (arXiv 1707.06347) with GAE (arXiv 1506.02438) and a critic; value clip 0.2, whitened
  advantages, a small k1 KL penalty in the reward (ROLL's 0.2 default suits reward models, not 0/1 rewards).
- reinforce_pp: REINFORCE++ (arXiv 2501.03262): k1 KL penalty 0.01 in the token rewards, returns with
  gamma 1, then the returns normalised over every valid token of the batch (advantage.whiten: mean and
  std over tokens, so longer responses weigh more; the population std, as OpenRLHF's implementation),
  PPO clip, token-mean. No response-level normalisation before the KL penalty (that is ROLL's
  "reinforce++" configuration, still reachable as advantage.norm_mean=batch, norm_std=batch).
- reinforce_pp_baseline: the same with the group mean of the outcome subtracted first (REINFORCE++ w/
  baseline). The response-level form (the centred rewards over their batch std per response) is the
  estimator group_centred_batch_std.
- rloo: "Back to Basics" (arXiv 2402.14740): leave-one-out baseline, no std. Deviation: the paper's KL
  penalty (0.03, on the whole sequence's reward before the baseline) is not reproduced; no KL.
- gspo: GSPO (arXiv 2507.18071): sequence-level ratio with the paper's clip range 3e-4 / 4e-4, no KL.
- cispo: MiniMax-M1 (arXiv 2506.13585) with ROLL's bounds 0.1 / 0.1 and GRPO advantages.
- topr: TOPR (arXiv 2503.14286) on group-mean-centred rewards.
- asyppo: AsyPPO (arXiv 2510.01656): the ppo preset with 2 critics (critic.num_critics, set through
  ``PRESET_SECTIONS``) on disjoint responses of every prompt, GAE on their mean value, and the masks of
  their disagreement: advantages of the lowest 20% (k) and the entropy term of the highest 20% (h) of the
  valid tokens. The entropy coefficient beta is not published in the material we have; 0.001 is ours (the
  filter needs a term to act on). The paper's group size 32 and ppo_epochs 4 (high-reuse ablation) are
  rollout.samples_per_prompt and policy.epochs, left to the run.
- opd: pure on-policy distillation (ROLL ``is_pure_opd``; Agarwal et al., GKD, arXiv 2306.13649; Thinking
  Machines, "On-Policy Distillation", 2025): each token's advantage is -(log pi_student - log pi_teacher)
  of its sampled token, discount 0, no task reward, no baseline; PPO clip without dual clip, token-mean.
  The teacher's model is ``teacher.model_path``.
- remax: ReMax (arXiv 2310.10505), Algorithm 1: REINFORCE (vanilla loss, token-mean) with each prompt's greedy
  response's reward as the baseline; the authors' scripts (liziniu/ReMax, step3 run_llama2_7b.sh): k1 KL
  penalty 0.05 in the reward, reward clip 5 (on r - r_greedy). Deviation: those scripts give each token its
  own KL term plus the reward discounted by gamma 0.99; gyre's returns (gamma 1) add up the KL penalties of
  the tokens after it.
- opo: OPO (arXiv 2505.23585; verl docs/algo/opo.md): the length-weighted group mean as baseline, no std,
  no KL, no entropy bonus, the PPO loss without dual clip. Its exact on-policy training (one optimizer step
  per rollout batch) is the policy section's mini-batch: the plan notes it when a run takes more.
- gpg: GPG (arXiv 2504.02546; the authors' README table and GPGTrainer): group mean, F_norm = 1 (norm_std
  none), alpha = B / (B - M), the plain policy gradient -A log pi averaged over tokens, no KL. The authors'
  resampling up to a valid share beta_th is rollout.dynamic_sampling.
- clip_cov / kl_cov: "The Entropy Mechanism of RL for Reasoning LMs" (arXiv 2505.22617), the authors'
  recipes (PRIME-RL/Entropy-Mechanism-of-RL, recipe/dapo/7b_clip_cov.sh and 7b_kl_cov.sh): GRPO advantages,
  token-mean, no KL; Clip-Cov with clip ratio 1 (both sides), r = 2e-4, band (1, 5); KL-Cov with k = 2e-3
  (their 7B value; 2e-4 for 32B), beta = 1. Their DAPO group filter is the difficulty mask (0, 1), as in dapo.
- gmpo: GMPO (arXiv 2507.20673; verl examples/gmpo_trainer): GRPO advantages, log-ratio clip 0.4 on both
  sides, a sequence-level mean (seq-mean-token-mean), no KL.
- sapo: SAPO (arXiv 2511.20347; verl examples/sapo_trainer): GRPO advantages, tau_pos 1.0, tau_neg 1.05,
  seq-mean-token-mean, no KL.
"""

from __future__ import annotations

import copy
import difflib
from typing import Any

from gyre.config.aliases import move_renamed, renamed_value

_NO_DUAL_CLIP = {"ppo": {"dual_clip_c": None}}
"""No PPO-loss paper here caps negative advantages (dual clip): the schema's default c = 3 must not leak in."""
_GRPO_ADVANTAGE = {"estimator": "reinforce", "norm_mean": "group", "norm_std": "group"}
"""GRPO's advantages: the outcome normalised by its group's mean and std."""


def _ppo_loss(agg: str, **shared: Any) -> dict[str, Any]:
    """The ppo loss (token ratio unless ``shared`` says otherwise) without dual clip, aggregated by ``agg``."""
    return {"variant": "ppo", **shared, **_NO_DUAL_CLIP, "agg": agg}


def _reinforce_pp(norm_mean: str) -> dict[str, Any]:
    """REINFORCE++ (norm_mean none) or its baseline variant (group): the returns, after the KL penalty,
    normalised over the batch's valid tokens by the advantage whitening."""
    return {"advantage": {"estimator": "reinforce", "norm_mean": norm_mean, "norm_std": "none", "whiten": True,
                          "std_ddof": 0, "gamma": 1.0},
            "loss": _ppo_loss("token-mean"), "kl": {"reward_coef": 0.01, "reward_estimator": "k1"}}


def overlay(base: dict[str, Any], mine: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``mine`` written over it, section by section: a sub-section ``mine`` writes keeps the
    keys of ``base``'s it does not name (a preset's ``loss`` under a user's ``loss: {clip_high: 0.3}``)."""
    out = dict(base)
    for key, value in mine.items():
        out[key] = overlay(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


PRESETS: dict[str, dict[str, Any]] = {
    "grpo": {"advantage": _GRPO_ADVANTAGE, "loss": _ppo_loss("seq-mean-token-mean"), "kl": {"loss_coef": 0.001}},
    "dr_grpo": {"advantage": {"estimator": "reinforce", "norm_mean": "group", "norm_std": "none"},
                "loss": _ppo_loss("seq-mean-token-sum-norm")},
    "dapo": {"advantage": _GRPO_ADVANTAGE, "loss": _ppo_loss("token-mean", clip_low=0.2, clip_high=0.28),
             "masks": {"overlong": True, "overlong_penalty_frac": 0.2, "difficulty": (0.0, 1.0)}},
    "lite_ppo": {"advantage": {"estimator": "reinforce", "norm_mean": "group", "norm_std": "batch"},
                 "loss": _ppo_loss("token-mean")},
    "ppo": {"advantage": {"estimator": "gae", "norm_mean": "none", "norm_std": "none", "gamma": 1.0, "whiten": True,
                          "gae": {"lam": 0.95}},
            "loss": _ppo_loss("token-mean"), "critic": {"value_clip": 0.2},
            "kl": {"reward_coef": 0.01, "reward_estimator": "k1"}},
    "reinforce_pp": _reinforce_pp("none"),
    "reinforce_pp_baseline": _reinforce_pp("group"),
    "rloo": {"advantage": {"estimator": "rloo", "norm_mean": "none", "norm_std": "none"},
             "loss": _ppo_loss("token-mean")},
    "gspo": {"advantage": _GRPO_ADVANTAGE,
             "loss": _ppo_loss("seq-mean-token-mean", ratio_level="sequence", clip_low=3e-4, clip_high=4e-4)},
    "cispo": {"advantage": _GRPO_ADVANTAGE,
              "loss": {"variant": "cispo", "cispo": {"low": 0.1, "high": 0.1}, "agg": "token-mean"}},
    "topr": {"advantage": {"estimator": "reinforce", "norm_mean": "group", "norm_std": "none"},
             "loss": {"variant": "topr", "topr": {"positive_weight": 1.0, "negative_weight": 1.0},
                      "agg": "token-mean"}},
    "opd": {"advantage": {"estimator": "reinforce", "norm_mean": "none", "norm_std": "none", "gamma": 0.0},
            "loss": _ppo_loss("token-mean"), "distill": {"coef": 1.0, "mode": "pure"}},
    "remax": {"advantage": {"estimator": "remax", "norm_mean": "none", "norm_std": "none", "reward_clip": 5.0},
              "loss": {"variant": "vanilla", "agg": "token-mean"},
              "kl": {"reward_coef": 0.05, "reward_estimator": "k1"}},
    "opo": {"advantage": {"estimator": "opo", "norm_mean": "none", "norm_std": "none"},
            "loss": _ppo_loss("token-mean", entropy_coef=0.0), "kl": {"loss_coef": 0.0}},
    "gpg": {"advantage": {"estimator": "gpg", "norm_mean": "group", "norm_std": "none"},
            "loss": {"variant": "vanilla", "agg": "token-mean"}, "kl": {"loss_coef": 0.0}},
    "clip_cov": {"advantage": _GRPO_ADVANTAGE,
                 "loss": {"variant": "clip_cov", "clip_low": 1.0, "clip_high": 1.0,
                          "clip_cov": {"ratio": 2e-4, "lb": 1.0, "ub": 5.0}, "agg": "token-mean"},
                 "kl": {"loss_coef": 0.0}, "masks": {"difficulty": (0.0, 1.0)}},
    "kl_cov": {"advantage": _GRPO_ADVANTAGE,
               "loss": {"variant": "kl_cov", "kl_cov": {"ratio": 2e-3, "coef": 1.0}, "agg": "token-mean"},
               "kl": {"loss_coef": 0.0}, "masks": {"difficulty": (0.0, 1.0)}},
    "gmpo": {"advantage": _GRPO_ADVANTAGE,
             "loss": {"variant": "gmpo", "gmpo": {"clip_low": 0.4, "clip_high": 0.4}, "agg": "seq-mean-token-mean"},
             "kl": {"loss_coef": 0.0}},
    "sapo": {"advantage": _GRPO_ADVANTAGE,
             "loss": {"variant": "sapo", "sapo": {"tau_pos": 1.0, "tau_neg": 1.05}, "agg": "seq-mean-token-mean"},
             "kl": {"loss_coef": 0.0}},
}
PRESETS["asyppo"] = overlay(PRESETS["ppo"], {
    "critic": {"value_aggregation": "mean", "data_division": "group_response_split", "adv_mask_low_pct": 0.2,
               "entropy_filter_high_pct": 0.2},
    "loss": {"entropy_coef": 0.001}})

PRESET_SECTIONS: dict[str, dict[str, dict[str, Any]]] = {
    "asyppo": {"critic": {"num_critics": 2}},
}
"""Knobs a preset sets outside the algorithm section, by section; keys the user writes there win."""


def expand_preset(data: Any) -> Any:
    """``algorithm: NAME`` or ``{preset: NAME, ...}`` -> the preset's knobs, overlaid with the user's keys,
    section by section. Keys of the earlier flat section (``clip_high``) move to their sections first, so
    they override the preset's as the new keys (``loss.clip_high``) would."""
    if isinstance(data, str):
        data = {"preset": data}
    data = move_renamed(data, "algorithm")
    problem = renamed_value(data, "algorithm")
    if problem:
        raise ValueError(problem)
    if not isinstance(data, dict) or data.get("preset") is None:
        return data
    name = data["preset"]
    if name not in PRESETS:
        close = difflib.get_close_matches(str(name), list(PRESETS), n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown algorithm preset {name!r}{hint} (presets: {', '.join(PRESETS)})")
    return overlay(copy.deepcopy(PRESETS[name]), data)


def leaves(knobs: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of every value in a nested mapping of knobs, in order: a preset's explicit knobs."""
    out = []
    for key, value in knobs.items():
        path = f"{prefix}{key}"
        out.extend(leaves(value, path + ".") if isinstance(value, dict) else [(path, value)])
    return out


def value_at(section: Any, dotted: str) -> Any:
    """The value at ``dotted`` (``loss.ppo.dual_clip_c``) of a config section; tuples for lists."""
    for part in dotted.split("."):
        section = getattr(section, part)
    return tuple(section) if isinstance(section, list) else section


def expand_preset_sections(data: Any) -> Any:
    """A run config's raw sections with its algorithm preset's ``PRESET_SECTIONS`` keys filled in under the
    user's (an unknown preset is left for the algorithm section to report)."""
    if not isinstance(data, dict):
        return data
    algorithm = data.get("algorithm")
    name = algorithm if isinstance(algorithm, str) else algorithm.get("preset") if isinstance(algorithm, dict) else None
    if name not in PRESET_SECTIONS:
        return data
    out = dict(data)
    for section, knobs in PRESET_SECTIONS[name].items():
        mine = out.get(section)
        out[section] = {**knobs, **mine} if isinstance(mine, dict) else knobs if mine is None else mine
    return out


def preset_sections_report(cfg) -> list[str]:
    """Lines for ``gyre check``: the knobs the run's preset set in other sections (``PRESET_SECTIONS``)."""
    lines = []
    for section, knobs in PRESET_SECTIONS.get(cfg.algorithm.preset, {}).items():
        for key, value in knobs.items():
            now = getattr(getattr(cfg, section), key)
            tag = "" if now == value else f"  (overridden: {now!r})"
            lines.append(f"  {section + '.' + key:<22} {value!r}{tag}")
    return lines


def preset_report(algorithm) -> list[str]:
    """Lines for ``gyre check``: what the preset expanded to, and which knobs the user changed."""
    if algorithm.preset is None:
        return ["algorithm: no preset; every knob as configured"]
    lines = [f"algorithm preset {algorithm.preset!r} expands to:"]
    for key, value in leaves(PRESETS[algorithm.preset]):
        now = value_at(algorithm, key)
        mine = tuple(now) if isinstance(now, (list, tuple)) else now
        tag = "" if mine == value else f"  (overridden: {now!r})"
        lines.append(f"  {key:<30} {value!r}{tag}")
    return lines


def algorithm_problems(a) -> list[str]:
    """Knob combinations that make no sense on their own (those that depend on other sections, such as
    the group size, are checked in ``derive.make_plan``)."""
    problems = []
    adv, loss, kl = a.advantage, a.loss, a.kl
    if loss.ratio_level == "sequence" and not loss.row.sequence_ratio:
        problems.append(f"algorithm.loss.ratio_level=sequence (GSPO) clips a sequence ratio inside the ppo loss; "
                        f"it does not apply to loss.variant={loss.variant}")
    if not adv.row.scoped and (adv.norm_mean, adv.norm_std) != ("none", "none"):
        problems.append(f"algorithm.advantage.estimator={adv.estimator} computes its own baseline and scale; set "
                        "algorithm.advantage.norm_mean=none and algorithm.advantage.norm_std=none")
    if a.uses_turns and kl.reward_coef > 0:
        problems.append(f"algorithm.kl.reward_coef puts a per-token KL penalty into the token rewards, which "
                        f"estimator={adv.estimator} (credit per model turn) does not read; use algorithm.kl.loss_coef "
                        "for a KL term, or set kl.reward_coef=0")
    if kl.target is not None and kl.reward_coef == 0:
        problems.append("algorithm.kl.target adapts the KL reward penalty, which is off; set algorithm.kl.reward_coef "
                        "> 0 (its starting value)")
    if loss.agg_norm is not None and loss.agg != "seq-mean-token-sum-norm":
        problems.append(f"algorithm.loss.agg_norm is the constant of seq-mean-token-sum-norm, not of {loss.agg}")
    if a.old_logprobs == "rollout":
        for knob in a.needs_trainer_old_logprobs:
            problems.append(f"{knob} compares the trainer's pi_old with the sampler's log-probs, so pi_old cannot "
                            "be the sampler's; set algorithm.old_logprobs=auto or recompute")
    if (a.critic.adv_mask_low_pct or a.critic.entropy_filter_high_pct) and not a.uses_critic:
        problems.append(f"algorithm.critic.adv_mask_low_pct / entropy_filter_high_pct rank the disagreement of "
                        f"several critics, and estimator={adv.estimator} has none; use estimator=gae with "
                        "critic.num_critics >= 2 (algorithm=asyppo), or set both to 0")
    problems += _distill_problems(a)
    if a.credit.fai_far < a.credit.fai_near:
        problems.append(f"algorithm.credit.fai_far={a.credit.fai_far} < fai_near={a.credit.fai_near}: FAI would "
                        "average over no tokens; fai_far must be >= fai_near")
    if kl.loss_grad_estimator is not None and kl.loss_coef == 0:
        problems.append("algorithm.kl.loss_grad_estimator sets the gradient of the KL loss, which is off; set "
                        "algorithm.kl.loss_coef > 0")
    difficulty = a.masks.difficulty
    if difficulty is not None and difficulty[0] >= difficulty[1]:
        problems.append(f"algorithm.masks.difficulty {list(difficulty)} keeps nothing: low must be < high")
    return problems


def _distill_problems(a) -> list[str]:
    """Pure distillation replaces the advantages, so knobs that only shape them would be ignored silently."""
    if a.distill.mode != "pure" or a.distill.coef == 0:
        return []
    problems = []
    if a.uses_critic or a.uses_turns:
        problems.append(f"algorithm.distill.mode=pure makes each token's advantage the teacher's signal alone, so "
                        f"estimator={a.advantage.estimator} would compute advantages that are thrown away; use "
                        "estimator=reinforce, or distill.mode=advantage to add the signal to its advantages")
    if a.kl.reward_coef > 0:
        problems.append("algorithm.distill.mode=pure does not use the token rewards, so kl.reward_coef has no "
                        "effect; set it to 0 (kl.loss_coef keeps a KL term to the reference)")
    return problems
