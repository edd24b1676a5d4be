"""AsyPPO's entropy filter in the policy loss: I^H takes tokens out of the entropy bonus, not its denominator."""

import pytest
import torch

from gyre.algos import LossDenominator
from gyre.engines.losses import PolicyLoss, PolicyLossSpec
from gyre.types import MetricSums, TrainBatch


def test_entropy_mask_filters_the_bonus_but_keeps_the_denominator():
    # Two response tokens with advantage 0 (so the PPO term is 0), entropies 2 and 1; I^H drops the first.
    b = TrainBatch(input_ids=torch.tensor([[5, 6, 7]]), attention_mask=torch.ones(1, 3, dtype=torch.long),
                   response_mask=torch.tensor([[0.0, 1.0, 1.0]]), advantages=torch.zeros(1, 3),
                   rollout_logprobs=torch.tensor([[0.0, -1.0, -2.0]]),
                   entropy_mask=torch.tensor([[1.0, 0.0, 1.0]]))
    lp = torch.tensor([[0.0, -1.0, -2.0]], requires_grad=True)
    entropy = torch.tensor([[0.0, 2.0, 1.0]], requires_grad=True)
    metrics = MetricSums()
    spec = PolicyLossSpec(entropy_coef=0.1, old_source="rollout")
    loss = PolicyLoss(LossDenominator(tokens=2), spec)(b, lp, entropy, metrics)
    # token-mean over both tokens: -0.1 * (0 * 2 + 1 * 1) / 2 = -0.05 (unfiltered it would be -0.15)
    assert loss.item() == pytest.approx(-0.05)
    loss.backward()
    assert entropy.grad.tolist() == [[0.0, 0.0, pytest.approx(-0.05)]]
    assert metrics.means()["entropy"] == pytest.approx(1.5)  # the logged entropy is every token's
