"""The presets and knobs users of other frameworks expect by name: each preset expands to its source's knobs,
``gyre check`` shows what they turn on, and the combinations that cannot work are refused early."""

from pathlib import Path

import pytest

from gyre.config import ConfigError, load_config, make_plan
from gyre.config.presets import PRESETS
from gyre.config.report import format_plan

BASE = ["model.path=m", "data.train_files=[t.jsonl]"]
EXAMPLES = Path(__file__).parents[2] / "examples"

# Each preset's knobs as its source states them (see gyre/config/presets.py for the citations).
SOURCES = {
    # ReMax Algorithm 1 (REINFORCE, greedy baseline); liziniu/ReMax run_llama2_7b.sh: kl_ctl 0.05, reward clip 5.
    "remax": {"estimator": "remax", "policy_loss": "vanilla", "loss_agg": "token-mean", "kl_reward_coef": 0.05,
              "kl_reward_estimator": "k1", "reward_clip": 5.0, "norm_mean": "none", "norm_std": "none"},
    # OPO: length-weighted baseline, no std, no KL, no entropy, PPO loss (exactly on-policy).
    "opo": {"estimator": "opo", "policy_loss": "ppo", "dual_clip_c": None, "kl_loss_coef": 0.0, "entropy_coef": 0.0,
            "loss_agg": "token-mean", "norm_mean": "none", "norm_std": "none"},
    # GPG: F_norm = 1, alpha = B / (B - M), -A log pi averaged over tokens, no KL.
    "gpg": {"estimator": "gpg", "norm_mean": "group", "norm_std": "none", "policy_loss": "vanilla",
            "loss_agg": "token-mean", "kl_loss_coef": 0.0},
    # Entropy Mechanism recipes 7b_clip_cov.sh / 7b_kl_cov.sh: GRPO, token-mean, no KL, group filter.
    "clip_cov": {"policy_loss": "clip_cov", "clip_low": 1.0, "clip_high": 1.0, "clip_cov_ratio": 2e-4,
                 "clip_cov_lb": 1.0, "clip_cov_ub": 5.0, "loss_agg": "token-mean", "kl_loss_coef": 0.0,
                 "norm_mean": "group", "norm_std": "group", "difficulty_mask": (0.0, 1.0)},
    "kl_cov": {"policy_loss": "kl_cov", "kl_cov_ratio": 2e-3, "kl_cov_coef": 1.0, "loss_agg": "token-mean",
               "kl_loss_coef": 0.0, "norm_mean": "group", "norm_std": "group", "difficulty_mask": (0.0, 1.0)},
    # GMPO: log-ratio clip (e^-0.4, e^0.4), sequence-level mean, GRPO advantages, no KL.
    "gmpo": {"policy_loss": "gmpo", "gmpo_clip_low": 0.4, "gmpo_clip_high": 0.4, "loss_agg": "seq-mean-token-mean",
             "norm_mean": "group", "norm_std": "group", "kl_loss_coef": 0.0},
    # SAPO: tau_pos 1.0, tau_neg 1.05, sequence-level mean, GRPO advantages, no KL.
    "sapo": {"policy_loss": "sapo", "sapo_tau_pos": 1.0, "sapo_tau_neg": 1.05, "loss_agg": "seq-mean-token-mean",
             "norm_mean": "group", "norm_std": "group", "kl_loss_coef": 0.0},
}


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_preset_reproduces_its_source(name):
    cfg = load_config(None, BASE + [f"algorithm={name}"])
    for key, value in SOURCES[name].items():
        got = getattr(cfg.algorithm, key)
        assert (tuple(got) if isinstance(got, list) else got) == value, key
    assert set(SOURCES[name]) <= set(PRESETS[name]) | {"norm_mean", "norm_std"}
    make_plan(cfg, "cpu", 4)


def report(*overrides):
    cfg = load_config(None, BASE + list(overrides))
    return format_plan(cfg, make_plan(cfg, "cpu", 4))


def test_check_shows_what_the_named_knobs_turn_on():
    text = report("algorithm=remax")
    assert "advantages           remax" in text
    assert "greedy baseline      + 1 greedy sample per prompt (temperature 0), scored, used as the baseline" in text
    assert "policy loss          clip_cov (token ratio; clip_low=1.0, clip_high=1.0, clip_cov_ratio=0.0002, " \
           "clip_cov_lb=1.0, clip_cov_ub=5.0), aggregated token-mean" in report("algorithm=clip_cov")
    assert "sapo_tau_pos=1.0, sapo_tau_neg=1.05" in report("algorithm=sapo")
    assert "advantages           pass_at_k (k=4)" in report("algorithm.estimator=pass_at_k", "algorithm.norm_mean=none",
                                                             "algorithm.norm_std=none")
    text = report("algorithm.kl_loss_coef=0.01", "algorithm.kl_loss_estimator=k1",
                  "algorithm.kl_loss_grad_estimator=k2")
    assert "KL loss              0.01 x k1 in value, k2 in gradient (straight-through)" in text
    text = report("algorithm.mismatch.weight=token", "algorithm.mismatch.normalize_weights=true",
                  "algorithm.mismatch.divergence=k3")
    assert "mismatch             token weights <= 1.2, batch-normalised; k3 divergence rejection, sequence_mean " \
           "<= 0.01" in text
    assert "aggregated token-sum" in report("algorithm.loss_agg=token-sum")


@pytest.mark.parametrize("overrides,message", [
    (["algorithm.clip_cov_lb=5", "algorithm.clip_cov_ub=1"], "clip_cov_lb=5 must be below clip_cov_ub=1"),
    (["algorithm.kl_loss_grad_estimator=k2"], "kl_loss_grad_estimator sets the gradient of the KL loss, which is off"),
    (["algorithm.estimator=pass_at_k", "algorithm.norm_mean=none", "algorithm.norm_std=none", "algorithm.pass_k=9"],
     "algorithm.pass_k=9 draws subsets of 9 samples of each prompt, but rollout.samples_per_prompt=8"),
    (["algorithm=remax", "rollout.sampling.temperature=0"], "makes every sample the greedy response"),
    (["algorithm.preset=remax", "algorithm.norm_mean=group"], "computes its own baseline"),
])
def test_impossible_combinations_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        make_plan(load_config(None, BASE + overrides), "cpu", 4)


def test_remax_learns_from_prompts_only():
    cfg = load_config(EXAMPLES / "agentic_guess_number.yaml", ["model.path=m", "algorithm=remax"])
    with pytest.raises(ConfigError, match="greedy response as its baseline, which the rollout generates for prompts"):
        make_plan(cfg, "cpu", 8)


def test_remax_with_one_sample_per_prompt_and_the_notes():
    # ReMax compares each sample with the greedy response, not with the other samples: G = 1 is the paper's setting.
    assert make_plan(load_config(None, BASE + ["algorithm=remax", "rollout.samples_per_prompt=1"]), "cpu", 4)
    plan = make_plan(load_config(None, BASE + ["algorithm=opo", "policy.mini_batch_size=16"]), "cpu", 4)
    assert any("estimator=opo derives its baseline for exact on-policy training" in n for n in plan.notes)
    plan = make_plan(load_config(None, BASE + ["algorithm.pass_k=2"]), "cpu", 4)
    assert "algorithm.pass_k: no effect, estimator=reinforce is not pass_at_k" in plan.notes


@pytest.mark.parametrize("override,expected", [
    ("algorithm.tau_neg=1.1", "did you mean 'algorithm.sapo_tau_neg'? (verl: tau_neg)"),
    ("algorithm.loss_mode=geo_mean", "did you mean 'algorithm.policy_loss'? (verl: loss_mode; verl's geo_mean is gmpo"),
    ("algorithm.rollout_is_batch_normalize=true", "did you mean 'algorithm.mismatch.normalize_weights'?"),
    ("algorithm.rollout_rs=seq_mean_k3", "divergence=k3, divergence_level=sequence_mean"),
])
def test_verl_names_point_at_gyres_keys(override, expected):
    with pytest.raises(ConfigError) as exc:
        load_config(None, BASE + [override])
    assert expected in str(exc.value)
