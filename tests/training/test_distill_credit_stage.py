"""The advantage stage with on-policy distillation and attention-based credit, by hand."""

import math

import pytest
import torch

from tests.training.test_advantage import run, sample, stage, to_batch

LN2 = math.log(2)


def test_pure_distillation_replaces_the_advantages():
    cfg, plan = stage("algorithm.preset=opd", "teacher.model_path=t", n=2)
    samples = [sample(0, 0, 1.0, 3), sample(0, 1, 0.0, 3)]
    batch = to_batch(samples, 0)  # prompt [1, 2], response tokens at positions 2..4
    batch.rollout_logprobs = torch.log(torch.tensor([[1, 1, 0.5, 0.2, 0.9], [1, 1, 0.3, 0.3, 0.3]]))
    batch.teacher_logprobs = torch.log(torch.tensor([[1, 1, 0.25, 0.4, 0.9], [1, 1, 0.6, 0.3, 0.15]]))
    batch, metrics, _ = run(cfg, plan, samples, 2, batch)
    # -(log student - log teacher): row 0 [-ln 2, ln 2, 0], row 1 [ln 2, 0, -ln 2]; the rewards 1 / 0 are unused.
    assert batch.advantages[:, 2:].tolist() == [pytest.approx([-LN2, LN2, 0], abs=1e-6),
                                                pytest.approx([LN2, 0, -LN2], abs=1e-6)]
    assert metrics["distill/reverse_kl"] == pytest.approx(0.0, abs=1e-6)


def test_mixed_distillation_adds_the_scaled_kl_to_the_grpo_advantage():
    cfg, plan = stage("algorithm.preset=grpo", "algorithm.kl.loss_coef=0", "algorithm.distill.coef=0.5",
                      "teacher.model_path=t", n=2)
    samples = [sample(0, 0, 1.0, 2), sample(0, 1, 0.0, 2)]
    batch = to_batch(samples, 0)
    batch.rollout_logprobs = torch.log(torch.tensor([[1, 1, 0.5, 0.5], [1, 1, 0.5, 0.5]]))
    batch.teacher_logprobs = torch.log(torch.tensor([[1, 1, 0.25, 0.5], [1, 1, 1.0, 0.5]]))
    batch, metrics, _ = run(cfg, plan, samples, 2, batch)
    # GRPO: +-0.70711; minus 0.5 x [ln 2, 0] and 0.5 x [-ln 2, 0].
    assert batch.advantages[0, 2:].tolist() == pytest.approx([0.70711 - LN2 / 2, 0.70711], abs=1e-5)
    assert batch.advantages[1, 2:].tolist() == pytest.approx([-0.70711 + LN2 / 2, -0.70711], abs=1e-5)
    assert metrics["distill/reverse_kl"] == pytest.approx(0.0, abs=1e-6)  # (ln 2 + 0 - ln 2 + 0) / 4


def test_credit_scales_only_the_non_negative_advantages():
    cfg, plan = stage("algorithm.preset=grpo", "algorithm.kl.loss_coef=0", "algorithm.credit.strategy=coupled", n=2)
    samples = [sample(0, 0, 1.0, 3), sample(0, 1, 0.0, 3)]
    batch = to_batch(samples, 0)
    batch.credit_scales = torch.tensor([[1, 1, 1.5, 1, 1.25], [1, 1, 1.5, 1, 1]])
    batch, metrics, _ = run(cfg, plan, samples, 2, batch)
    # GRPO +-0.70711: row 0 (A > 0) scaled token by token; row 1 (A < 0) unchanged.
    assert batch.advantages[0, 2:].tolist() == pytest.approx([1.06066, 0.70711, 0.88388], abs=1e-5)
    assert batch.advantages[1, 2:].tolist() == pytest.approx([-0.70711] * 3, abs=1e-5)
    assert metrics["credit/amplified_frac"] == pytest.approx(3 / 6)
