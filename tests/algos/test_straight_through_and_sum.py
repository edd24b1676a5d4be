"""Straight-through KL estimators (value of one, gradient of another) and the token-sum aggregation."""

import math

import pytest
import torch

from gyre.algos.aggregation import LossDenominator, aggregate_loss
from gyre.algos.kl import kl_estimate, kl_straight_through


@pytest.mark.parametrize("d", [0.5, -0.5, 3.0])
def test_k3_value_with_k2_gradient(d):
    # d = log pi - log pi_ref. k3 = e^-d - 1 + d: 0.106531 at 0.5, 0.148721 at -0.5. k2 = d^2 / 2, gradient d
    # (k3's own gradient would be 1 - e^-d: 0.393469 at 0.5, -0.648721 at -0.5).
    lp = torch.tensor([d], dtype=torch.float64, requires_grad=True)
    kl = kl_straight_through(lp, torch.zeros(1, dtype=torch.float64), "k3", "k2")
    assert kl.item() == pytest.approx(math.exp(-d) - 1 + d)
    kl.sum().backward()
    assert lp.grad.item() == pytest.approx(d)
    if d == 0.5:
        assert kl.item() == pytest.approx(0.106531, abs=1e-6)


def test_k1_value_with_k2_gradient_and_the_plain_forms():
    lp = torch.tensor([0.5, -0.5], dtype=torch.float64, requires_grad=True)
    ref = torch.zeros(2, dtype=torch.float64)
    kl = kl_straight_through(lp, ref, "k1", "k2")  # verl's "k1+": value d, gradient d (k1's own would be 1)
    assert kl.tolist() == [0.5, -0.5]
    kl.sum().backward()
    assert lp.grad.tolist() == [0.5, -0.5]
    # No gradient estimator, or the same one: the plain estimate, its own gradient.
    for grad in (None, "k3"):
        assert torch.equal(kl_straight_through(lp, ref, "k3", grad), kl_estimate(lp, ref, "k3"))


def test_token_sum_has_no_normaliser_and_keeps_the_global_rule():
    # Sequence 1 losses [1, 3], sequence 2 [2, 2, 2, 6] (algorithms.md section 10): token-sum = 16.
    values = torch.tensor([[1.0, 3.0, 0.0, 0.0], [2.0, 2.0, 2.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    assert aggregate_loss(values, mask, "token-sum", LossDenominator(tokens=6, sequences=2)).item() == 16.0
    # Two ranks, one sequence each: each share is scaled by dp_size 2 (4 * 2 = 8, 12 * 2 = 24); the backend's
    # average over the ranks, (8 + 24) / 2, is the single-device 16 whatever the split.
    denom = LossDenominator(tokens=6, sequences=2, dp_size=2)
    shares = [aggregate_loss(values[i:i + 1], mask[i:i + 1], "token-sum", denom).item() for i in range(2)]
    assert shares == [8.0, 24.0] and sum(shares) / 2 == 16.0
    # NaN in padding is selected away, not multiplied by 0.
    values[0, 3] = float("nan")
    assert aggregate_loss(values, mask, "token-sum", LossDenominator(tokens=6)).item() == 16.0
