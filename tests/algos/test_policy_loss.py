import math

import pytest
import torch

from gyre.algos import ppo_clip_loss


def _one(ratio: float, adv: float, low=0.2, high=0.2):
    lp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    out = ppo_clip_loss(lp, torch.zeros(1, 1), torch.tensor([[adv]]), low, high)
    out.token_loss.sum().backward()
    # d loss / d logp = -(coefficient) * A * d rho / d logp / rho ... the coefficient c_t multiplying -A * dlogp
    coef = -lp.grad.item() / adv
    return out.token_loss.item(), coef, out


@pytest.mark.parametrize("ratio,adv,loss,coef", [
    # Worked table (eps = 0.2): loss = -min(rho A, clip(rho, 0.8, 1.2) A); coef = rho inside, 0 when clipped.
    (1.5, +1, -1.2, 0.0),   # upper clip active: -min(1.5, 1.2)
    (0.5, +1, -0.5, 0.5),   # A > 0 and rho small: unclipped branch is the min
    (0.5, -1, 0.8, 0.0),    # lower clip active: -min(-0.5, -0.8) = 0.8
    (1.5, -1, 1.5, 1.5),    # A < 0, rho large: unclipped -1.5 is the min
    (1.1, +1, -1.1, 1.1),   # inside the trust region
])
def test_ppo_clip_worked_table(ratio, adv, loss, coef):
    got_loss, got_coef, _ = _one(ratio, adv)
    assert got_loss == pytest.approx(loss, abs=1e-6)
    assert got_coef == pytest.approx(coef, abs=1e-6)


def test_clip_higher_uses_its_own_upper_bound():
    # eps_high = 0.28: -min(1.5, 1.28) = -1.28
    loss, coef, _ = _one(1.5, +1, low=0.2, high=0.28)
    assert loss == pytest.approx(-1.28) and coef == 0.0


def test_clip_fraction_flags():
    lp = torch.log(torch.tensor([[1.5, 0.5, 0.5, 1.0]]))
    adv = torch.tensor([[1.0, -1.0, 1.0, 1.0]])
    out = ppo_clip_loss(lp, torch.zeros(1, 4), adv)
    assert out.clipped_high.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    assert out.clipped_low.tolist() == [[0.0, 1.0, 0.0, 0.0]]
