import math

import pytest
import torch

from gyre.algos.kl import AdaptiveKLController, kl_estimate, kl_penalized_rewards


@pytest.mark.parametrize("d,k1,absd,k2,k3", [
    # k2 = d^2 / 2 = 0.125; k3 = exp(-d) - 1 + d: exp(-0.5) - 0.5 = 0.1065; exp(0.5) - 1.5 = 0.1487
    (0.5, 0.5, 0.5, 0.125, 0.1065),
    (-0.5, -0.5, 0.5, 0.125, 0.1487),
])
def test_kl_worked_examples(d, k1, absd, k2, k3):
    lp, ref = torch.tensor([d]), torch.tensor([0.0])
    assert kl_estimate(lp, ref, "k1").item() == pytest.approx(k1, abs=1e-4)
    assert kl_estimate(lp, ref, "abs").item() == pytest.approx(absd, abs=1e-4)
    assert kl_estimate(lp, ref, "k2").item() == pytest.approx(k2, abs=1e-4)
    assert kl_estimate(lp, ref, "k3").item() == pytest.approx(k3, abs=1e-4)


def test_k3_is_non_negative_and_zero_at_equality():
    d = torch.linspace(-5, 5, 101)
    assert (kl_estimate(d, torch.zeros_like(d), "k3") >= 0).all()
    assert kl_estimate(torch.tensor([0.3]), torch.tensor([0.3]), "k3").item() == 0.0


def test_k3_does_not_overflow():
    assert torch.isfinite(kl_estimate(torch.tensor([-100.0]), torch.tensor([0.0]), "k3")).all()


def test_unknown_estimator():
    with pytest.raises(ValueError, match="k1, abs, k2 or k3"):
        kl_estimate(torch.zeros(1), torch.zeros(1), "k9")  # type: ignore[arg-type]


def test_kl_penalized_rewards_masks_and_padding():
    # Row: 2 response tokens then padding whose reference log-prob is -inf (must not leak NaN).
    # k1 = [0.2, -0.1]; beta 0.5 -> r' = [0 - 0.1, 1 + 0.05] = [-0.1, 1.05]; padding keeps its reward (0).
    rewards = torch.tensor([[0.0, 1.0, 0.0]])
    logp = torch.tensor([[-1.0, -2.0, 0.0]])
    ref = torch.tensor([[-1.2, -1.9, -math.inf]])
    mask = torch.tensor([[1, 1, 0]])
    penalised, kl = kl_penalized_rewards(rewards, logp, ref, mask, coef=0.5, kind="k1")
    assert torch.allclose(penalised, torch.tensor([[-0.1, 1.05, 0.0]]))
    assert torch.allclose(kl, torch.tensor([[0.2, -0.1, 0.0]]))
    # abs estimator: |k1| = [0.2, 0.1] -> r' = [-0.1, 1 - 0.05] = [-0.1, 0.95]
    penalised, _ = kl_penalized_rewards(rewards, logp, ref, mask, coef=0.5, kind="abs")
    assert torch.allclose(penalised, torch.tensor([[-0.1, 0.95, 0.0]]))


def test_adaptive_kl_controller_worked_example():
    # e = clip(0.15 / 0.1 - 1, -0.2, 0.2) = clip(0.5) = 0.2; beta = 0.2 * (1 + 0.2 * 256 / 10000) = 0.201024
    ctl = AdaptiveKLController(coef=0.2, target=0.1, horizon=10000)
    ctl.update(observed_kl=0.15, n_steps=256)
    assert ctl.coef == pytest.approx(0.201024, abs=1e-12)


@pytest.mark.parametrize("observed,expected", [
    (0.11, 0.2 * (1 + 0.1 * 256 / 10000)),   # e = 0.1 (inside the clip) -> 0.200512
    (0.05, 0.2 * (1 - 0.2 * 256 / 10000)),   # e = -0.5 clipped to -0.2 -> 0.198976
    (0.1, 0.2),                              # on target: unchanged
])
def test_adaptive_kl_controller_error_clip(observed, expected):
    ctl = AdaptiveKLController(coef=0.2, target=0.1)
    ctl.update(observed, n_steps=256)
    assert ctl.coef == pytest.approx(expected, abs=1e-12)


def test_fixed_kl_controller_and_roundtrip():
    ctl = AdaptiveKLController(coef=0.3)
    ctl.update(observed_kl=5.0, n_steps=1000)
    assert ctl.coef == 0.3  # target None: fixed coefficient
    adaptive = AdaptiveKLController(coef=0.2, target=0.1, horizon=500)
    adaptive.update(0.3, 64)
    assert AdaptiveKLController.from_dict(adaptive.to_dict()) == adaptive
    assert AdaptiveKLController.from_dict(ctl.to_dict()) == ctl
    with pytest.raises(ValueError):
        AdaptiveKLController(coef=0.2, target=0.0)
