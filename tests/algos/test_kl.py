import pytest
import torch

from gyre.algos import kl_estimate


@pytest.mark.parametrize("d,k1,k2,k3", [
    # k3 = exp(-d) - 1 + d: exp(-0.5) - 0.5 = 0.1065; exp(0.5) - 1.5 = 0.1487
    (0.5, 0.5, 0.125, 0.1065),
    (-0.5, -0.5, 0.125, 0.1487),
])
def test_kl_worked_examples(d, k1, k2, k3):
    lp, ref = torch.tensor([d]), torch.tensor([0.0])
    assert kl_estimate(lp, ref, "k1").item() == pytest.approx(k1, abs=1e-4)
    assert kl_estimate(lp, ref, "k2").item() == pytest.approx(k2, abs=1e-4)
    assert kl_estimate(lp, ref, "k3").item() == pytest.approx(k3, abs=1e-4)


def test_k3_is_non_negative_and_zero_at_equality():
    d = torch.linspace(-5, 5, 101)
    assert (kl_estimate(d, torch.zeros_like(d), "k3") >= 0).all()
    assert kl_estimate(torch.tensor([0.3]), torch.tensor([0.3]), "k3").item() == 0.0


def test_k3_does_not_overflow():
    assert torch.isfinite(kl_estimate(torch.tensor([-100.0]), torch.tensor([0.0]), "k3")).all()


def test_unknown_estimator():
    with pytest.raises(ValueError, match="k1, k2 or k3"):
        kl_estimate(torch.zeros(1), torch.zeros(1), "k9")  # type: ignore[arg-type]
