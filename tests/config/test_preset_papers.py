"""Every preset's resolved knobs against its paper's list (schema defaults included: a knob the preset
leaves out takes the schema's default, which must then be the paper's value too).

Each row: the paper (where in it), the knobs it fixes, and the deviations gyre chose, which the preset's
docstring in ``gyre.config.presets`` repeats. A new preset needs a row here.
"""

from dataclasses import dataclass, field

import pytest

from gyre.config import load_config
from gyre.config.presets import PRESETS, value_at


@dataclass(frozen=True)
class Paper:
    source: str
    knobs: dict
    deviations: list[str] = field(default_factory=list)


# Knobs shared by the PPO-clip papers: symmetric clip 0.2 and no dual clip (Ye et al.'s dual clip is a
# separate paper none of these uses), token ratios.
PPO_CLIP = {"loss.variant": "ppo", "loss.ratio_level": "token", "loss.clip_low": 0.2, "loss.clip_high": 0.2,
            "loss.ppo.dual_clip_c": None}
NO_KL = {"kl.loss_coef": 0.0, "kl.reward_coef": 0.0}
# REINFORCE++ with or without its group baseline: no std on the outcome, the returns whitened over tokens.
REINFORCE_PP = {"advantage.estimator": "reinforce", "advantage.norm_std": "none", "advantage.whiten": True,
                "advantage.std_ddof": 0, "advantage.gamma": 1.0,
                **PPO_CLIP, "loss.agg": "token-mean", "kl.reward_estimator": "k1", "kl.reward_coef": 0.01,
                "kl.loss_coef": 0.0}

PAPERS = {
    "grpo": Paper(
        "DeepSeekMath, arXiv 2402.03300: group-normalised outcome, PPO clip 0.2, per-sequence mean "
        "of token losses, k3 KL loss",
        {"advantage.estimator": "reinforce", "advantage.norm_mean": "group", "advantage.norm_std": "group", **PPO_CLIP,
         "loss.agg": "seq-mean-token-mean", "kl.loss_estimator": "k3", "kl.loss_coef": 0.001, "kl.reward_coef": 0.0,
         "advantage.whiten": False},
        ["KL coefficient 0.001 (ROLL's and verl's GRPO, algorithms.md section 11), not the paper's 0.04"]),
    "dr_grpo": Paper(
        "Understanding R1-Zero-Like Training, arXiv 2503.20783: group mean without std, token sum "
        "over a constant; no KL (its Oat recipe, beta 0)",
        {"advantage.estimator": "reinforce", "advantage.norm_mean": "group", "advantage.norm_std": "none", **PPO_CLIP,
         "loss.agg": "seq-mean-token-sum-norm", **NO_KL, "advantage.whiten": False}),
    "dapo": Paper(
        "DAPO, arXiv 2503.14476, sections 2.3 and 4.1: clip-higher 0.2 / 0.28, token-level loss, overlong filtering, "
        "soft overlong punishment 4096 of 20480, dynamic sampling, no KL",
        {"advantage.estimator": "reinforce", "advantage.norm_mean": "group", "advantage.norm_std": "group", **PPO_CLIP,
         "loss.clip_high": 0.28,
         "loss.agg": "token-mean", **NO_KL, "masks.overlong": True, "masks.overlong_penalty_frac": 0.2,
         "masks.difficulty": (0.0, 1.0)},
        ["dynamic sampling masks zero-variance groups (masks.difficulty); refilling them is "
         "rollout.dynamic_sampling, outside the algorithm section"]),
    "lite_ppo": Paper(
        "Tricks or Traps (Lite PPO), arXiv 2508.08221: group mean with batch std, token-level loss, vanilla "
        "PPO clip, no KL",
        {"advantage.estimator": "reinforce", "advantage.norm_mean": "group", "advantage.norm_std": "batch", **PPO_CLIP,
         "loss.agg": "token-mean",
         **NO_KL, "advantage.whiten": False}),
    "ppo": Paper(
        "PPO, arXiv 1707.06347 (clip 0.2, advantage normalisation) with GAE, arXiv 1506.02438 (lambda 0.95); "
        "value clipping as in OpenAI baselines",
        {"advantage.estimator": "gae", "advantage.norm_mean": "none", "advantage.norm_std": "none", **PPO_CLIP,
         "advantage.whiten": True,
         "critic.value_clip": 0.2, "advantage.gamma": 1.0, "advantage.gae.lam": 0.95, "loss.agg": "token-mean",
         "kl.reward_estimator": "k1",
         "kl.reward_coef": 0.01, "kl.loss_coef": 0.0},
        ["a k1 KL reward penalty of 0.01 (RLHF practice; ROLL's 0.2 suits reward models, not 0/1 rewards)"]),
    "reinforce_pp": Paper(
        "REINFORCE++, arXiv 2501.03262: k1 KL penalty in the token rewards, returns with gamma 1, "
        "returns normalised over the batch's tokens (OpenRLHF: population std), PPO clip",
        {**REINFORCE_PP, "advantage.norm_mean": "none"},
        ["std + 1e-6 where OpenRLHF takes rsqrt(var + 1e-8) (gyre's one convention for every std)"]),
    "reinforce_pp_baseline": Paper(
        "REINFORCE++ w/ baseline, arXiv 2501.03262: the group mean subtracted from the outcome, "
        "then REINFORCE++'s token-level normalisation",
        {**REINFORCE_PP, "advantage.norm_mean": "group"}),
    "rloo": Paper(
        "Back to Basics, arXiv 2402.14740: leave-one-out baseline on the sequence reward, no std",
        {"advantage.estimator": "rloo", "advantage.norm_mean": "none", "advantage.norm_std": "none", **PPO_CLIP,
         "loss.agg": "token-mean",
         **NO_KL, "advantage.whiten": False},
        ["no KL: the paper's 0.03 (appendix C) penalises the whole sequence's reward before the baseline, which gyre's "
         "per-token penalty does not reproduce"]),
    "gspo": Paper(
        "GSPO, arXiv 2507.18071, section 5.1: length-normalised sequence ratio, clip 3e-4 / 4e-4, group-normalised "
        "advantages, sequence-level loss, no KL",
        {"advantage.estimator": "reinforce", "advantage.norm_mean": "group", "advantage.norm_std": "group",
         "loss.variant": "ppo",
         "loss.ratio_level": "sequence", "loss.clip_low": 3e-4, "loss.clip_high": 4e-4, "loss.ppo.dual_clip_c": None,
         "loss.agg": "seq-mean-token-mean", **NO_KL}),
    "cispo": Paper(
        "MiniMax-M1, arXiv 2506.13585: clipped, detached IS weight on every token, token-level loss",
        {"advantage.estimator": "reinforce", "advantage.norm_mean": "group", "advantage.norm_std": "group",
         "loss.variant": "cispo",
         "loss.cispo.unified_mask": False, "loss.agg": "token-mean", **NO_KL},
        ["weight bounds 0.1 / 0.1 are ROLL's; the paper leaves the lower bound loose and tunes the upper"]),
    "topr": Paper(
        "TOPR, arXiv 2503.14286: no IS on positive sequences, truncated IS on the others, unit weights",
        {"loss.variant": "topr", "loss.topr.positive_weight": 1.0, "loss.topr.negative_weight": 1.0,
         "loss.agg": "token-mean",
         **NO_KL},
        ["group-mean-centred rewards; the ratio truncated per token (as ROLL), not per trajectory"]),
    "asyppo": Paper(
        "AsyPPO, arXiv 2510.01656 (algorithms.md 3.2): PPO with GAE on the mean of 2 mini-critics trained on "
        "disjoint responses of each prompt; advantages of the lowest 20% and the entropy term of the highest 20% "
        "of the critics' disagreement masked",
        {"advantage.estimator": "gae", **PPO_CLIP, "critic.value_aggregation": "mean",
         "critic.data_division": "group_response_split",
         "critic.adv_mask_low_pct": 0.2, "critic.entropy_filter_high_pct": 0.2},
        ["the entropy coefficient 0.001 is gyre's (the filter needs a term; the paper's beta is not in our "
         "material); the rest as the ppo preset, so an ablation isolates the critics and masks"]),
    "opd": Paper(
        "On-policy distillation (ROLL is_pure_opd; GKD, arXiv 2306.13649): each token's advantage is the negative "
        "single-sample reverse KL to the teacher, discount 0, no task reward, no baseline",
        {"advantage.estimator": "reinforce", "advantage.norm_mean": "none", "advantage.norm_std": "none",
         "advantage.gamma": 0.0, **PPO_CLIP,
         "loss.agg": "token-mean", "distill.coef": 1.0, "distill.mode": "pure"},
        ["the coefficient multiplies the advantage in pure mode too (ROLL leaves it out there); at 1 they agree"]),
    "remax": Paper(
        "ReMax, arXiv 2310.10505, Algorithm 1: REINFORCE with the greedy response's reward as baseline; the "
        "authors' scripts (liziniu/ReMax, step3 run_llama2_7b.sh): k1 KL penalty 0.05 in the reward, reward clip 5, "
        "token-mean loss",
        {"advantage.estimator": "remax", "advantage.norm_mean": "none", "advantage.norm_std": "none",
         "loss.variant": "vanilla",
         "loss.agg": "token-mean", "kl.reward_coef": 0.05, "kl.reward_estimator": "k1", "advantage.reward_clip": 5.0,
         "kl.loss_coef": 0.0, "advantage.gamma": 1.0, "advantage.whiten": False},
        ["the scripts discount the reward by gamma 0.99 and give each token only its own KL term; gyre's returns "
         "(gamma 1) add up the KL penalties of the tokens after it"]),
    "opo": Paper(
        "OPO, arXiv 2505.23585 (verl docs/algo/opo.md): length-weighted group mean, no std, exact on-policy PPO "
        "loss, no KL, no entropy bonus",
        {"advantage.estimator": "opo", "advantage.norm_mean": "none", "advantage.norm_std": "none", **PPO_CLIP,
         "loss.agg": "token-mean", **NO_KL,
         "loss.entropy_coef": 0.0, "advantage.whiten": False},
        ["exact on-policy training is the policy section's mini-batch; the plan notes a run that takes more than "
         "one optimizer step per rollout batch"]),
    "gpg": Paper(
        "GPG, arXiv 2504.02546 (the authors' README table, GPGTrainer): group mean, F_norm = 1, "
        "alpha = B / (B - M), -A log pi averaged over tokens, no KL",
        {"advantage.estimator": "gpg", "advantage.norm_mean": "group", "advantage.norm_std": "none",
         "loss.variant": "vanilla",
         "loss.agg": "token-mean", **NO_KL, "advantage.whiten": False},
        ["the authors' resampling until a share beta_th of the samples is valid is rollout.dynamic_sampling"]),
    "clip_cov": Paper(
        "The Entropy Mechanism of RL for Reasoning LMs, arXiv 2505.22617; recipe/dapo/7b_clip_cov.sh: GRPO "
        "advantages, clip ratio 1, r = 2e-4, covariance band (1, 5), token-mean, no KL, DAPO's group filter",
        {"advantage.estimator": "reinforce", "advantage.norm_mean": "group", "advantage.norm_std": "group",
         "loss.variant": "clip_cov",
         "loss.clip_low": 1.0, "loss.clip_high": 1.0, "loss.clip_cov.ratio": 2e-4, "loss.clip_cov.lb": 1.0,
         "loss.clip_cov.ub": 5.0,
         "loss.agg": "token-mean", **NO_KL, "masks.difficulty": (0.0, 1.0)},
        ["the group filter masks zero-variance groups (masks.difficulty); refilling is rollout.dynamic_sampling",
         "the covariance is taken over each micro-batch, as in the authors' code"]),
    "kl_cov": Paper(
        "The Entropy Mechanism of RL for Reasoning LMs, arXiv 2505.22617; recipe/dapo/7b_kl_cov.sh: GRPO "
        "advantages, k = 0.2% (k_percent 0.2), beta 1, token-mean, no KL loss, DAPO's group filter",
        {"advantage.estimator": "reinforce", "advantage.norm_mean": "group", "advantage.norm_std": "group",
         "loss.variant": "kl_cov",
         "loss.kl_cov.ratio": 2e-3, "loss.kl_cov.coef": 1.0, "loss.agg": "token-mean", **NO_KL,
         "masks.difficulty": (0.0, 1.0)},
        ["k is the 7B recipe's; the 32B recipe uses 2e-4 (verl's default)"]),
    "gmpo": Paper(
        "GMPO, arXiv 2507.20673 (verl examples/gmpo_trainer): geometric mean of the token objectives, log-ratio "
        "clip 0.4 on both sides, sequence-level mean, GRPO advantages, no KL",
        {"advantage.estimator": "reinforce", "advantage.norm_mean": "group", "advantage.norm_std": "group",
         "loss.variant": "gmpo",
         "loss.gmpo.clip_low": 0.4, "loss.gmpo.clip_high": 0.4, "loss.agg": "seq-mean-token-mean", **NO_KL}),
    "sapo": Paper(
        "SAPO, arXiv 2511.20347 (verl examples/sapo_trainer): soft gate sigmoid(tau (rho - 1)) 4 / tau, tau_pos "
        "1.0, tau_neg 1.05, sequence-level mean, GRPO advantages, no KL",
        {"advantage.estimator": "reinforce", "advantage.norm_mean": "group", "advantage.norm_std": "group",
         "loss.variant": "sapo",
         "loss.sapo.tau_pos": 1.0, "loss.sapo.tau_neg": 1.05, "loss.agg": "seq-mean-token-mean", **NO_KL}),
}


def test_every_preset_has_its_paper():
    assert sorted(PAPERS) == sorted(PRESETS)


@pytest.mark.parametrize("name", sorted(PAPERS))
def test_preset_expands_to_its_papers_knobs(name):
    algorithm = load_config(None, ["model.path=m", "data.train_files=[t.jsonl]", f"algorithm={name}"]).algorithm
    got = {key: value_at(algorithm, key) for key in PAPERS[name].knobs}
    assert got == PAPERS[name].knobs, PAPERS[name].source


def test_asyppo_sets_its_two_critics():
    assert load_config(None, ["model.path=m", "data.train_files=[t.jsonl]", "algorithm=asyppo"]).critic.num_critics == 2


@pytest.mark.parametrize("name", sorted(PAPERS))
def test_ppo_loss_presets_decide_on_dual_clip(name):
    # The schema's dual clip (c = 3) would otherwise apply silently (GSPO had it until this test).
    if PAPERS[name].knobs.get("loss.variant") == "ppo":
        assert "dual_clip_c" in PRESETS[name]["loss"]["ppo"]
