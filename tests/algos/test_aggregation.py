import pytest
import torch

from gyre.algos.aggregation import LossDenominator, aggregate_loss, denominator_for

MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def _worked():
    # Sequence 1 token losses [1, 3]; sequence 2 [2, 2, 2, 6]; padded length 4.
    values = torch.tensor([[1.0, 3.0, 0.0, 0.0], [2.0, 2.0, 2.0, 6.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float64)
    return values, mask


@pytest.mark.parametrize("mode,expected", [
    ("token-mean", 16 / 6),              # (4 + 12) / 6 tokens = 2.6667
    ("seq-mean-token-sum", 8.0),         # 16 / 2 sequences
    ("seq-mean-token-mean", 2.5),        # (4/2 + 12/4) / 2 = (2 + 3) / 2
    ("seq-mean-token-sum-norm", 2.0),    # 16 / (2 sequences * 4)
])
def test_worked_example_all_modes(mode, expected):
    values, mask = _worked()
    denom = denominator_for(mask, norm_length=4)
    assert (denom.tokens, denom.sequences) == (6.0, 2.0)
    assert aggregate_loss(values, mask, mode, denom).item() == pytest.approx(expected)


def test_legacy_constructor_still_works():
    values, mask = _worked()
    loss = aggregate_loss(values, mask, "token-mean", LossDenominator(tokens=6))
    assert loss.item() == pytest.approx(16 / 6)
    assert LossDenominator(tokens=6, dp_size=2).sequences == 1.0


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


def test_global_denominator_two_ranks_seq_mean_token_mean():
    # Rank 0: (4 / 2) * 2 / 2 sequences = 2; rank 1: (12 / 4) * 2 / 2 = 3; DP average 2.5 = single device.
    values, mask = _worked()
    denom = denominator_for(mask, dp_size=2)
    r0 = aggregate_loss(values[:1], mask[:1], "seq-mean-token-mean", denom).item()
    r1 = aggregate_loss(values[1:], mask[1:], "seq-mean-token-mean", denom).item()
    assert (r0, r1) == (pytest.approx(2.0), pytest.approx(3.0))


def test_empty_rows_are_not_sequences():
    # An all-padding row adds no sequence and contributes 0 (no NaN from its zero length).
    values = torch.tensor([[1.0, 3.0], [7.0, 7.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    denom = denominator_for(mask, norm_length=2)
    assert (denom.tokens, denom.sequences) == (2.0, 1.0)
    assert aggregate_loss(values, mask, "seq-mean-token-mean", denom).item() == pytest.approx(2.0)  # 4 / 2 / 1
    assert aggregate_loss(values, mask, "seq-mean-token-sum-norm", denom).item() == pytest.approx(2.0)  # 4/(1*2)


def test_errors():
    values, mask = _worked()
    with pytest.raises(ValueError, match="norm_length"):
        aggregate_loss(values, mask, "seq-mean-token-sum-norm", denominator_for(mask))
    with pytest.raises(ValueError, match="unknown"):
        aggregate_loss(values, mask, "seq-sum", denominator_for(mask))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        LossDenominator(tokens=1, norm_length=0.0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dp,ga", [(1, 1), (1, 2), (2, 1), (2, 2), (3, 1), (3, 2)])
def test_sharded_equals_unsharded(mode, dp, ga):
    """DP ranks x accumulation steps give the single-device loss and gradient (fp64, 1e-9)."""
    g = torch.Generator().manual_seed(dp * 10 + ga)
    per_micro = 3
    rows = dp * ga * per_micro
    w = torch.randn(5, dtype=torch.float64, generator=g)
    x = torch.randn(rows, 7, 5, dtype=torch.float64, generator=g)
    mask = (torch.rand(rows, 7, generator=g) > 0.3).double()
    mask[::4] = 0.0  # some empty rows: they must not count as sequences anywhere

    def loss_and_grad(rows_idx, denom):
        wi = w.clone().requires_grad_(True)
        loss = aggregate_loss((x[rows_idx] @ wi) ** 2, mask[rows_idx], mode, denom)
        loss.backward()
        return loss.detach(), wi.grad

    full_loss, full_grad = loss_and_grad(torch.arange(rows), denominator_for(mask, norm_length=7))
    denom = denominator_for(mask, dp_size=dp, norm_length=7)
    losses, grads = [], []
    for r in range(dp):
        acc_loss, acc_grad = torch.zeros((), dtype=torch.float64), torch.zeros(5, dtype=torch.float64)
        for a in range(ga):  # gradient accumulation: sum of micro-batch shares
            idx = torch.arange(rows)[(r * ga + a) * per_micro:(r * ga + a + 1) * per_micro]
            loss, grad = loss_and_grad(idx, denom)
            acc_loss, acc_grad = acc_loss + loss, acc_grad + grad
        losses.append(acc_loss)
        grads.append(acc_grad)
    # What DDP / FSDP all-reduce does: average over ranks.
    assert torch.allclose(torch.stack(losses).mean(), full_loss, rtol=0, atol=1e-9)
    assert torch.allclose(torch.stack(grads).mean(dim=0), full_grad, rtol=0, atol=1e-9)
