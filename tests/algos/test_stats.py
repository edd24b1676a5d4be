import math

import pytest
import torch

from gyre.algos.stats import RunningMoments, masked_mean, masked_sum, masked_var, masked_whiten, where_valid

NAN, INF = math.nan, math.inf


def test_masked_sum_and_mean():
    values = torch.tensor([1.0, 2.0, 3.0, 100.0])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    assert masked_sum(values, mask).item() == 6.0  # 1 + 2 + 3
    assert masked_mean(values, mask).item() == 2.0  # 6 / 3
    assert masked_mean(values, torch.zeros(4)).item() == 0.0  # empty mask: 0, not NaN


def test_masked_var_hand_computed():
    # valid [1, 2, 3]: mean 2, squared deviations 1 + 0 + 1 = 2 -> ddof 1: 2 / 2 = 1; ddof 0: 2 / 3
    values = torch.tensor([1.0, 2.0, 3.0, 100.0], dtype=torch.float64)
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    assert masked_var(values, mask, ddof=1).item() == pytest.approx(1.0)
    assert masked_var(values, mask, ddof=0).item() == pytest.approx(2 / 3)
    assert masked_var(values, mask).dim() == 0


def test_masked_var_too_few_entries_is_zero():
    values = torch.tensor([5.0, 7.0])
    assert masked_var(values, torch.tensor([1.0, 0.0]), ddof=1).item() == 0.0  # 1 entry < ddof + 1
    assert masked_var(values, torch.tensor([1.0, 0.0]), ddof=0).item() == 0.0  # one point: no spread
    assert masked_var(values, torch.zeros(2), ddof=0).item() == 0.0  # empty


def test_masked_whiten_hand_computed():
    # valid [2, 4, 6]: mean 4, sample std sqrt((4 + 0 + 4) / 2) = 2 -> [-1, 0, 1]; the off-mask entry becomes 0
    values = torch.tensor([[2.0, 4.0, 6.0, 50.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    out = masked_whiten(values, mask, eps=0.0)
    assert torch.allclose(out, torch.tensor([[-1.0, 0.0, 1.0, 0.0]], dtype=torch.float64))
    # shift_mean=False rescales only: (x - 4) / 2 + 4 = [3, 4, 5]
    out = masked_whiten(values, mask, shift_mean=False, eps=0.0)
    assert torch.allclose(out, torch.tensor([[3.0, 4.0, 5.0, 0.0]], dtype=torch.float64))
    # ddof 0: std sqrt(8 / 3) = 1.63299 -> [-1.22474, 0, 1.22474]
    out = masked_whiten(values, mask, eps=0.0, ddof=0)
    assert torch.allclose(out[0, :3], torch.tensor([-1.22474, 0.0, 1.22474], dtype=torch.float64), atol=1e-5)


def test_masked_whiten_below_two_entries_leaves_the_valid_one_and_zeroes_padding():
    values = torch.tensor([3.0, NAN])
    out = masked_whiten(values, torch.tensor([1.0, 0.0]))
    assert out.tolist() == [3.0, 0.0]  # one value: no spread to measure, left as it is (ROLL skips whitening)
    assert masked_whiten(values, torch.zeros(2)).tolist() == [0.0, 0.0]  # nothing valid: all padding


def test_masked_whiten_equal_values_give_zero_whatever_eps():
    # 0.1 three times: the computed std is rounding noise; (x - mean) / (noise + eps) is not 0, and 0 / 0 with
    # eps = 0 would be NaN. All-equal valid entries whiten to 0 (to their mean with shift_mean=False).
    values = torch.tensor([0.1, 0.1, 0.1, INF])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    for eps in (1e-6, 0.0):
        assert masked_whiten(values, mask, eps=eps).tolist() == [0.0, 0.0, 0.0, 0.0]
    assert masked_whiten(values, mask, shift_mean=False).tolist() == pytest.approx([0.1, 0.1, 0.1, 0.0])


def test_masked_whiten_divides_by_std_plus_eps():
    # valid [0, 0.002]: mean 0.001, std (ddof 1) sqrt(2e-6) = 1.41421e-3. The convention (x - mean) / (std + eps)
    # with eps 1e-6 gives 1e-3 / 1.41521e-3 = 0.706607; rsqrt(var + eps) would give 1e-3 / sqrt(3e-6) = 0.57735.
    values = torch.tensor([0.0, 0.002, NAN], dtype=torch.float64)
    out = masked_whiten(values, torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64), eps=1e-6)
    assert out.tolist() == pytest.approx([-0.706607, 0.706607, 0.0], abs=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_masked_whiten_property_zero_mean_unit_std(seed):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(4, 9, generator=g, dtype=torch.float64) * 3 + 2
    mask = (torch.rand(4, 9, generator=g) > 0.3).double()
    values[mask == 0] = NAN
    out = masked_whiten(values, mask, eps=0.0, ddof=1)
    valid = out[mask > 0]
    assert valid.mean().item() == pytest.approx(0.0, abs=1e-12) and valid.std().item() == pytest.approx(1.0)
    assert (out[mask == 0] == 0).all()


def test_masked_reductions_select_padding_away():
    # NaN and inf in padding would survive a product with the mask (NaN * 0 = NaN, inf * 0 = NaN).
    values = torch.tensor([1.0, 2.0, 3.0, NAN, INF, -INF], requires_grad=True)
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    assert masked_sum(values, mask).item() == 6.0
    assert masked_mean(values, mask).item() == 2.0
    var = masked_var(values, mask)
    assert var.item() == pytest.approx(1.0)  # deviations [-1, 0, 1]: 2 / (3 - 1)
    (masked_sum(values, mask) + var).backward()
    # d/dx (sum + var) = 1 + 2 (x - mean) / 2 on the valid entries; exactly 0 on padding
    assert values.grad.tolist() == [0.0, 1.0, 2.0, 0.0, 0.0, 0.0]
    assert where_valid(values, mask, -1.0).tolist() == [1.0, 2.0, 3.0, -1.0, -1.0, -1.0]


def test_masked_mean_broadcasts_a_row_value_over_the_mask():
    # [B, 1] values over a [B, T] mask: each row's value counts once per valid token: (1 * 2 + 5 * 1) / 3
    mean = masked_mean(torch.tensor([[1.0], [5.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]]))
    assert mean.item() == pytest.approx(7 / 3)


def test_running_moments_hand_computed():
    # [1, 2] then [3]: merged mean 2, m2 = 0.5 + 0 + (3 - 1.5)^2 * 2 * 1 / 3 = 2 -> sample std 1, population sqrt(2/3)
    rm = RunningMoments()
    rm.update(torch.tensor([1.0, 2.0]))
    rm.update(torch.tensor([3.0]))
    assert (rm.count, rm.mean, rm.m2) == (3.0, pytest.approx(2.0), pytest.approx(2.0))
    assert rm.std() == pytest.approx(1.0)
    assert rm.std(ddof=0) == pytest.approx(math.sqrt(2 / 3))


def test_running_moments_empty_and_single():
    rm = RunningMoments()
    assert rm.std() == 0.0
    rm.update(torch.tensor([]))
    assert rm.count == 0.0
    rm.update(torch.tensor([4.0]))
    assert rm.mean == 4.0 and rm.std(ddof=1) == 0.0 and rm.std(ddof=0) == 0.0


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_running_moments_over_chunks_equal_concatenation(seed):
    g = torch.Generator().manual_seed(seed)
    chunks = [torch.randn(int(n), dtype=torch.float64, generator=g) * 3 + 5
              for n in torch.randint(1, 20, (6,), generator=g)]
    rm = RunningMoments()
    for c in chunks:
        rm.update(c.reshape(-1, 1) if len(c) % 2 else c)  # any shape is flattened
    allv = torch.cat(chunks)
    assert rm.count == allv.numel()
    assert rm.mean == pytest.approx(allv.mean().item(), abs=1e-12)
    assert rm.var(ddof=1) == pytest.approx(allv.var(correction=1).item(), rel=1e-12)
    assert rm.std(ddof=0) == pytest.approx(allv.std(correction=0).item(), rel=1e-12)


def test_running_moments_roundtrip():
    rm = RunningMoments()
    rm.update(torch.tensor([1.0, 5.0, 2.0]))
    back = RunningMoments.from_dict(rm.to_dict())
    assert back == rm
