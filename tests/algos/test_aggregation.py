import pytest
import torch

from gyre.algos import LossDenominator, aggregate_loss


def _worked():
    # Sequence 1 token losses [1, 3]; sequence 2 [2, 2, 2, 6]; padded length 4.
    values = torch.tensor([[1.0, 3.0, 0.0, 0.0], [2.0, 2.0, 2.0, 6.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float64)
    return values, mask


def test_token_mean_worked_example():
    values, mask = _worked()
    loss = aggregate_loss(values, mask, "token-mean", LossDenominator(tokens=6))
    assert loss.item() == pytest.approx(16 / 6)  # 2.6667


def test_global_denominator_two_ranks_equals_one_device():
    # Rank 0 holds sequence 1 (sum 4), rank 1 sequence 2 (sum 12), 6 tokens globally.
    # Each contributes S * D / N: 4 * 2 / 6 = 1.3333 and 12 * 2 / 6 = 4.0; their DP average is 2.6667.
    values, mask = _worked()
    denom = LossDenominator(tokens=6, dp_size=2)
    r0 = aggregate_loss(values[:1], mask[:1], "token-mean", denom).item()
    r1 = aggregate_loss(values[1:], mask[1:], "token-mean", denom).item()
    assert r0 == pytest.approx(4 / 3) and r1 == pytest.approx(4.0)
    assert (r0 + r1) / 2 == pytest.approx(16 / 6)
    # The naive per-rank mean would give (2 + 3) / 2 = 2.5: wrong.


@pytest.mark.parametrize("dp,ga", [(1, 1), (1, 2), (2, 1), (2, 2), (3, 1), (3, 2)])
def test_sharded_gradient_equals_unsharded(dp, ga):
    """DP ranks x accumulation steps give the single-device token-mean gradient (fp64, 1e-6)."""
    g = torch.Generator().manual_seed(dp * 10 + ga)
    rows = dp * ga * 2
    w = torch.randn(5, dtype=torch.float64, generator=g)
    x = torch.randn(rows, 7, 5, dtype=torch.float64, generator=g)
    mask = (torch.rand(rows, 7, generator=g) > 0.3).double()
    mask[:, 0] = 1

    def grad_of(rows_idx, denom):
        wi = w.clone().requires_grad_(True)
        loss = aggregate_loss((x[rows_idx] @ wi) ** 2, mask[rows_idx], "token-mean", denom)
        loss.backward()
        return wi.grad

    full = grad_of(torch.arange(rows), LossDenominator(tokens=float(mask.sum())))
    denom = LossDenominator(tokens=float(mask.sum()), dp_size=dp)
    per_rank = []
    for r in range(dp):
        acc = torch.zeros(5, dtype=torch.float64)
        for a in range(ga):  # gradient accumulation: sum of micro-batch gradients
            idx = torch.arange(rows)[(r * ga + a) * 2:(r * ga + a + 1) * 2]
            acc += grad_of(idx, denom)
        per_rank.append(acc)
    averaged = torch.stack(per_rank).mean(dim=0)  # what DDP / FSDP all-reduce does
    assert torch.allclose(averaged, full, atol=1e-6)
