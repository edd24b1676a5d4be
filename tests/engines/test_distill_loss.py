"""The trainer's step loss with on-policy distillation as a loss term (distill_mode loss), by hand."""

import math

import pytest
import torch

from gyre.algos import LossDenominator
from gyre.engines.losses import PolicyLoss, PolicyLossSpec
from gyre.types import MetricSums, TrainBatch


def test_distill_loss_term_adds_half_the_squared_log_ratio_to_the_teacher():
    # One row: a prompt token, then two response tokens with advantage 0 (the PPO term is 0).
    lp = torch.tensor([[0.0, math.log(0.5), math.log(0.2)]], requires_grad=True)
    b = TrainBatch(input_ids=torch.tensor([[5, 6, 7]]), attention_mask=torch.ones(1, 3, dtype=torch.long),
                   response_mask=torch.tensor([[0.0, 1.0, 1.0]]), advantages=torch.zeros(1, 3),
                   rollout_logprobs=lp.detach().clone(),
                   teacher_logprobs=torch.tensor([[float("nan"), math.log(0.25), math.log(0.4)]]))
    spec = PolicyLossSpec(old_source="current", distill_loss_coef=0.5)
    metrics = MetricSums()
    loss = PolicyLoss(LossDenominator(tokens=2), spec)(b, lp, None, metrics)
    # d = [ln 2, -ln 2]; 1/2 d^2 = 0.240227 each; token-mean 0.240227; x 0.5 = 0.120113
    assert loss.item() == pytest.approx(0.120113, abs=1e-6)
    m = metrics.means()
    assert m["distill/loss"] == pytest.approx(0.240227, abs=1e-6)
    assert m["distill/reverse_kl_current"] == pytest.approx(0.0, abs=1e-6)  # (ln 2 - ln 2) / 2
    loss.backward()
    # d loss / d lp_t = 0.5 * d_t / 2 tokens = +-0.173287; the prompt position gets nothing (its NaN is masked).
    assert lp.grad.tolist()[0] == pytest.approx([0.0, 0.173287, -0.173287], abs=1e-6)


def test_without_teacher_logprobs_the_loss_mode_says_what_is_missing():
    lp = torch.zeros(1, 2, requires_grad=True)
    b = TrainBatch(input_ids=torch.zeros(1, 2, dtype=torch.long), attention_mask=torch.ones(1, 2, dtype=torch.long),
                   response_mask=torch.tensor([[0.0, 1.0]]), advantages=torch.zeros(1, 2),
                   rollout_logprobs=torch.zeros(1, 2))
    with pytest.raises(ValueError, match="distill.mode=loss needs the teacher's log-probs"):
        PolicyLoss(LossDenominator(tokens=1), PolicyLossSpec(old_source="current", distill_loss_coef=1.0))(
            b, lp, None, MetricSums())
