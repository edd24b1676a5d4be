"""The passes a step runs (gyre.training.plan): what the learner does and the simulator charges, by hand."""

import pytest

from gyre.config import load_config
from gyre.training.plan import StepPasses, step_passes

BASE = ["model.path=m", "data.train_files=[t.jsonl]", "rollout.prompts_per_step=8", "rollout.samples_per_prompt=8"]


def passes(*overrides) -> StepPasses:
    return step_passes(load_config(None, BASE + list(overrides)))


def test_grpo_with_a_kl_reference_scores_once_and_updates_once():
    # One optimizer step per batch: pi_old is the update's own (detached) forward, so the only scoring pass
    # is the reference's: 1 + 3 (forward and backward) = 4 forward-equivalents, not 5.
    p = passes("algorithm=grpo")
    assert (p.old_logprobs, p.reference, p.critics, p.epochs) == (False, True, 0, 1)
    assert p.forward_equivalents() == 4


def test_mini_batches_recompute_pi_old_and_checkpointing_reruns_the_forward():
    # 64 samples in mini-batches of 16: 4 optimizer steps, so the trainer recomputes pi_old first (1);
    # no KL term (DAPO): no reference; one update pass with checkpointing: 1 + 2 + 1 = 4; total 5.
    p = passes("algorithm=dapo", "policy.mini_batch_size=16", "model.gradient_checkpointing=true")
    assert (p.old_logprobs, p.reference, p.checkpointing) == (True, False, True)
    assert p.forward_equivalents() == 5


def test_a_critic_scores_and_trains_every_epoch_like_the_policy():
    # PPO, 2 epochs: pi_old recomputed (1), the critic's values (1), then per epoch 3 for the policy and 3
    # for the critic: 2 + 2 x 3 x 2 = 14.
    p = passes("algorithm.advantage.estimator=gae", "policy.epochs=2", "algorithm.kl.loss_coef=0")
    assert (p.old_logprobs, p.critics, p.epochs) == (True, 1, 2)
    assert p.forward_equivalents() == 2 + 2 * 3 * 2


def test_the_simulator_charges_the_learners_passes():
    from gyre.sim.scenario import scenario

    cfg = load_config(None, [*BASE, "algorithm=grpo", "simulate.model=7b", "simulate.device=h800"])
    spec = scenario(cfg, 8)
    assert spec.passes == 4
    # 7B (7.6e9 parameters) on 8 H800 (989 TFLOPs bf16 each, at the class's MFU): 1e6 tokens take
    # 2 x 4 x P x T FLOPs, not the earlier 2 x 5 x P x T.
    d = spec.cost.device
    want = d.train_overhead_s + 8 * spec.cost.model.params * 1e6 / (8 * d.peak_tflops * 1e12 * d.train_mfu)
    assert spec.cost.train_s(1e6, 8, spec.passes) == pytest.approx(want)
