import pytest
import torch

from gyre.algos.value import explained_variance, value_loss


def test_value_loss_unclipped():
    # 0.5 * (0.5 - 1.0)^2 = 0.125; 0.5 * (2 - 0)^2 = 2
    values = torch.tensor([[0.5, 2.0]])
    loss, flag = value_loss(values, torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]))
    assert torch.allclose(loss, torch.tensor([[0.125, 2.0]]))
    assert torch.equal(flag, torch.zeros(1, 2))


def test_value_loss_clipped_hand_computed():
    # Both tokens: V_old 0.5, V 0.9, clip 0.2 -> clipped V = 0.5 + 0.2 = 0.7.
    # Token 0, R = 1.0: unclipped (0.9 - 1)^2 = 0.01, clipped (0.7 - 1)^2 = 0.09 -> 0.5 * 0.09 = 0.045, flag 1.
    # Token 1, R = 0.0: unclipped 0.81, clipped 0.49 -> 0.5 * 0.81 = 0.405, flag 0.
    values = torch.tensor([[0.9, 0.9]], requires_grad=True)
    old = torch.tensor([[0.5, 0.5]])
    loss, flag = value_loss(values, old, torch.tensor([[1.0, 0.0]]), clip=0.2)
    assert torch.allclose(loss, torch.tensor([[0.045, 0.405]]))
    assert torch.equal(flag, torch.tensor([[1.0, 0.0]]))
    loss.sum().backward()
    # Token 0 takes the clipped branch, whose value is outside the trust region: no gradient.
    # Token 1: d/dV 0.5 (V - R)^2 = V - R = 0.9.
    assert torch.allclose(values.grad, torch.tensor([[0.0, 0.9]]))


def test_value_loss_rejects_negative_clip():
    with pytest.raises(ValueError):
        value_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), clip=-0.1)


def test_explained_variance_hand_computed():
    # Valid R = [1, 2, 3]: population var 2/3. V = [1.5, 2, 2.5]: R - V = [-0.5, 0, 0.5], var 0.5 / 3 = 1/6.
    # EV = 1 - (1/6) / (2/3) = 0.75. The fourth token is off-mask and ignored.
    returns = torch.tensor([[1.0, 2.0, 3.0, 40.0]])
    values = torch.tensor([[1.5, 2.0, 2.5, -7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert explained_variance(values, returns, mask) == pytest.approx(0.75)
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)  # perfect critic
    assert explained_variance(torch.full_like(returns, 2.0), returns, mask) == pytest.approx(0.0)  # the mean


def test_explained_variance_degenerate_is_zero():
    returns = torch.tensor([[0.1, 0.1, 0.1]])
    assert explained_variance(torch.zeros(1, 3), returns, torch.ones(1, 3)) == 0.0  # Var(R) = 0
    assert explained_variance(torch.zeros(1, 3), returns, torch.zeros(1, 3)) == 0.0  # empty mask
