"""The knobs users of other frameworks expect by name: ``gyre check`` shows what they turn on, the combinations
that cannot work are refused early, and verl's names point at gyre's keys. (Each preset's expansion against its
source is in ``test_preset_papers.py``.)"""

from pathlib import Path

import pytest

from gyre.config import ConfigError, load_config, make_plan
from gyre.config.report import format_plan

BASE = ["model.path=m", "data.train_files=[t.jsonl]"]
EXAMPLES = Path(__file__).parents[2] / "examples"


def report(*overrides):
    cfg = load_config(None, BASE + list(overrides))
    return format_plan(cfg, make_plan(cfg, "cpu", 4))


def test_check_shows_what_the_named_knobs_turn_on():
    text = report("algorithm=remax")
    assert "advantages           remax" in text
    assert "greedy baseline      + 1 greedy sample per prompt (temperature 0), scored, used as the baseline" in text
    assert "policy loss          vanilla (no ratio), aggregated token-mean" in text
    assert "policy loss          clip_cov (token ratio; clip_low=1.0, clip_high=1.0, clip_cov.ratio=0.0002, " \
           "clip_cov.lb=1.0, clip_cov.ub=5.0), aggregated token-mean" in report("algorithm=clip_cov")
    assert "sapo.tau_pos=1.0, sapo.tau_neg=1.05" in report("algorithm=sapo")
    assert "advantages           pass_at_k (k=4)" in report("algorithm.advantage.estimator=pass_at_k",
                                                             "algorithm.advantage.norm_mean=none",
                                                             "algorithm.advantage.norm_std=none")
    text = report("algorithm.kl.loss_coef=0.01", "algorithm.kl.loss_estimator=k1",
                  "algorithm.kl.loss_grad_estimator=k2")
    assert "KL loss              0.01 x k1 in value, k2 in gradient (straight-through)" in text
    text = report("algorithm.mismatch.weight=token", "algorithm.mismatch.normalize_weights=true",
                  "algorithm.mismatch.divergence=k3")
    assert "mismatch             token weights <= 1.2, batch-normalised; k3 divergence rejection, sequence_mean " \
           "<= 0.01" in text
    assert "aggregated token-sum" in report("algorithm.loss.agg=token-sum")


@pytest.mark.parametrize("overrides,message", [
    (["algorithm.loss.clip_cov.lb=5", "algorithm.loss.clip_cov.ub=1"],
     "algorithm.loss.clip_cov: lb=5 must be below ub=1: Clip-Cov draws the tokens it detaches from the covariances "
     "strictly between them"),
    (["algorithm.kl.loss_grad_estimator=k2"], "kl.loss_grad_estimator sets the gradient of the KL loss, which is off"),
    (["algorithm.advantage.estimator=pass_at_k", "algorithm.advantage.norm_mean=none",
      "algorithm.advantage.norm_std=none", "algorithm.advantage.pass_at_k.k=9"],
     "algorithm.advantage.pass_at_k.k=9 draws subsets of 9 samples of each prompt, but rollout.samples_per_prompt=8"),
    (["algorithm=remax", "rollout.sampling.temperature=0"], "makes every sample the greedy response"),
    (["algorithm.preset=remax", "algorithm.advantage.norm_mean=group"], "computes its own baseline"),
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
    plan = make_plan(load_config(None, BASE + ["algorithm.advantage.pass_at_k.k=2"]), "cpu", 4)
    assert "algorithm.advantage.pass_at_k.k: no effect, estimator=reinforce is not pass_at_k" in plan.notes


@pytest.mark.parametrize("override,expected", [
    ("algorithm.tau_neg=1.1", "did you mean 'algorithm.loss.sapo.tau_neg'? (verl: tau_neg)"),
    ("algorithm.loss_mode=geo_mean",
     "did you mean 'algorithm.loss.variant'? (verl: loss_mode; verl's geo_mean is gmpo"),
    ("algorithm.rollout_is_batch_normalize=true", "did you mean 'algorithm.mismatch.normalize_weights'?"),
    ("algorithm.rollout_rs=seq_mean_k3", "divergence=k3, divergence_level=sequence_mean"),
    ("algorithm.rollout_rs_threshold=0.01", "For *_k2 / *_k3 it is algorithm.mismatch.divergence_max"),
])
def test_verl_names_point_at_gyres_keys(override, expected):
    with pytest.raises(ConfigError) as exc:
        load_config(None, BASE + [override])
    assert expected in str(exc.value)
