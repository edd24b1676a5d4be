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


EXACT = {  # the formulas of Schulman's note, written out once more, without any numerical care
    "k1": lambda d: d,
    "abs": lambda d: d.abs(),
    "k2": lambda d: 0.5 * d * d,
    "k3": lambda d: torch.exp(-d) - 1 + d,
}


def value_and_grad(fn, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    d = d.clone().requires_grad_(True)
    value = fn(d)
    value.sum().backward()
    return value.detach(), d.grad


@pytest.mark.parametrize("kind", ["k1", "abs", "k2", "k3"])
def test_unclamped_estimates_match_autograd_of_the_exact_formula(kind):
    # fp64, log-ratios -50..50 (exp(50) = 5.2e21 is still exact there).
    d = torch.linspace(-50, 50, 2001, dtype=torch.float64)
    got, got_grad = value_and_grad(lambda x: kl_estimate(x, torch.zeros_like(x), kind, clamp=None), d)
    want, want_grad = value_and_grad(EXACT[kind], d)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    assert torch.allclose(got_grad, want_grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["k1", "abs", "k2", "k3"])
def test_clamped_estimates_are_the_clamped_exact_formula(kind):
    # The bound (default 10) is a clamp of the exact value: the same value and gradient as autograd of
    # clamp(exact, -10, 10), i.e. the exact gradient inside the bound and 0 beyond it, never of the other sign.
    d = torch.linspace(-50, 50, 2001, dtype=torch.float64)
    got, got_grad = value_and_grad(lambda x: kl_estimate(x, torch.zeros_like(x), kind), d)
    want, want_grad = value_and_grad(lambda x: EXACT[kind](x).clamp(-10.0, 10.0), d)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    assert torch.allclose(got_grad, want_grad, rtol=1e-12, atol=1e-12)
    _, exact_grad = value_and_grad(EXACT[kind], d)
    assert (got_grad * exact_grad >= 0).all()


@pytest.mark.parametrize("d,value,grad", [
    (0.5, 0.10653, 0.39347),      # exp(-0.5) - 0.5; gradient 1 - exp(-0.5)
    (-0.5, 0.14872, -0.64872),    # exp(0.5) - 1.5; gradient 1 - exp(0.5): pulls d back up to 0
    (-2.0, 4.38906, -6.38906),    # exp(2) - 3, inside the bound
    (-3.0, 10.0, 0.0),            # exp(3) - 4 = 16.09 > 10: clamped, no gradient
    (-25.0, 10.0, 0.0),           # the old exponent clamp at 20 gave e^20 - 26 here, with gradient +1
    (11.0, 10.0, 0.0),            # exp(-11) + 10 = 10.0000167 > 10
    (10.0, 9.00005, 0.99995),     # exp(-10) + 9
])
def test_k3_bound_hand_computed(d, value, grad):
    got, got_grad = value_and_grad(lambda x: kl_estimate(x, torch.zeros_like(x), "k3"), torch.tensor([d]))
    assert got.item() == pytest.approx(value, abs=1e-5)
    assert got_grad.item() == pytest.approx(grad, abs=1e-5)


def test_k3_in_float32_and_half_precision_is_finite_everywhere():
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        d = torch.linspace(-200, 200, 801).to(dtype)
        value, grad = value_and_grad(lambda x: kl_estimate(x, torch.zeros_like(x), "k3"), d)
        assert torch.isfinite(value).all() and torch.isfinite(grad).all(), dtype
        assert value.max().item() == 10.0


def test_k3_near_zero_keeps_its_precision():
    # exp(-d) - 1 + d loses the d^2 / 2 to rounding near 0 in float32; expm1(-d) + d does not.
    d = torch.tensor([1e-3])
    assert kl_estimate(d, torch.zeros(1), "k3").item() == pytest.approx(0.5e-6 - 1e-9 / 6, rel=1e-3)


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
