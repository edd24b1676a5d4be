import math

import pytest
import torch

from gyre.algos.mismatch import importance_weights, mismatch_filter, mismatch_log_ratio, mismatch_metrics

# Reference algorithms.md section 7 worked example: delta = log pi_old - log mu = [0.1, -0.05, 0.3, 0.0],
# segments {1, 2} and {3, 4}. A 5th, padded position holds garbage that must never matter.
DELTA = [0.1, -0.05, 0.3, 0.0]
BEHAVIOUR = torch.full((1, 5), math.log(0.5))            # mu = 0.5 on every token
OLD = BEHAVIOUR + torch.tensor([DELTA + [7.0]])          # padding: delta 7 (ratio 1097)
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
SEGMENTS = torch.tensor([[0, 0, 1, 1, 9]])

# token: exp(delta); segment: exp(0.025) = 1.0253, exp(0.15) = 1.1618; geometric: exp(0.35 / 4) = 1.0914;
# sequence: exp(0.35) = 1.4191.
BEFORE = {
    "token": [1.1052, 0.9512, 1.3499, 1.0],
    "segment": [1.0253, 1.0253, 1.1618, 1.1618],
    "geometric": [1.0914] * 4,
    "sequence": [1.4191] * 4,
}
AFTER = {  # min(w, 1.2): only token 3 and the sequence weight exceed the bound
    "token": [1.1052, 0.9512, 1.2, 1.0],
    "segment": [1.0253, 1.0253, 1.1618, 1.1618],
    "geometric": [1.0914] * 4,
    "sequence": [1.2] * 4,
}


@pytest.mark.parametrize("level", ["token", "segment", "geometric", "sequence"])
def test_worked_example_weights(level):
    log_w = mismatch_log_ratio(OLD, BEHAVIOUR, MASK, level, segments=SEGMENTS)
    assert torch.exp(log_w)[0, :4].tolist() == pytest.approx(BEFORE[level], abs=1e-4)
    assert log_w[0, 4].item() == 0.0
    w = importance_weights(OLD, BEHAVIOUR, MASK, level, upper_bound=1.2, segments=SEGMENTS)
    assert w[0, :4].tolist() == pytest.approx(AFTER[level], abs=1e-4)
    assert w[0, 4].item() == 1.0                         # off mask: neutral weight
    assert not w.requires_grad


def test_segment_without_ids_is_the_whole_row():
    seg = mismatch_log_ratio(OLD, BEHAVIOUR, MASK, "segment")
    geo = mismatch_log_ratio(OLD, BEHAVIOUR, MASK, "geometric")
    assert torch.equal(seg, geo)


@pytest.mark.parametrize("level,keep", [
    ("token", [1, 1, 0, 1, 0]),        # token 3: 1.3499 > 1.2
    ("sequence", [0, 0, 0, 0, 0]),     # 1.4191 > 1.2: the whole sequence goes
    ("geometric", [1, 1, 1, 1, 0]),    # 1.0914 inside [0.8, 1.2]
    ("segment", [1, 1, 1, 1, 0]),      # 1.0253 and 1.1618 both inside
])
def test_worked_example_ratio_filter(level, keep):
    got = mismatch_filter(OLD, BEHAVIOUR, MASK, level, ratio_low=0.8, ratio_high=1.2, segments=SEGMENTS)
    assert got.tolist() == [[float(k) for k in keep]]


@pytest.mark.parametrize("level,diff_high,keep", [
    # p_mu = 0.5, p_old = 0.5 exp(delta) -> diff = [0.0526, -0.0244, 0.1749, 0.0].
    ("token", 0.1, [1, 1, 0, 1, 0]),
    # Segment means: (0.0526 - 0.0244) / 2 = 0.0141 and (0.1749 + 0) / 2 = 0.0875.
    ("segment", 0.05, [1, 1, 0, 0, 0]),
    # Row mean (geometric and sequence alike): 0.2031 / 4 = 0.0508.
    ("geometric", 0.05, [0, 0, 0, 0, 0]),
    ("sequence", 0.06, [1, 1, 1, 1, 0]),
])
def test_diff_filter(level, diff_high, keep):
    got = mismatch_filter(OLD, BEHAVIOUR, MASK, level, ratio_low=None, ratio_high=None, diff_low=-0.2,
                          diff_high=diff_high, segments=SEGMENTS)
    assert got.tolist() == [[float(k) for k in keep]]


def test_metrics_worked_example():
    m = mismatch_metrics(OLD, BEHAVIOUR, MASK)
    assert m["mismatch/ratio_token"] == pytest.approx((1.1052 + 0.9512 + 1.3499 + 1.0) / 4, abs=1e-4)
    assert m["mismatch/ratio_geometric"] == pytest.approx(1.0914, abs=1e-4)
    assert m["mismatch/ratio_segment"] == pytest.approx(1.0914, abs=1e-4)   # whole-row segments
    assert m["mismatch/ratio_sequence"] == pytest.approx(1.4191, abs=1e-4)
    assert m["mismatch/abs_logratio"] == pytest.approx(0.45 / 4)
    assert m["mismatch/ratio_max_token"] == pytest.approx(1.3499, abs=1e-4)
    assert all(isinstance(v, float) for v in m.values())
    # With the example's segments: mean over the two segments of 1.0253 and 1.1618.
    seg = mismatch_metrics(OLD, BEHAVIOUR, MASK, segments=SEGMENTS)["mismatch/ratio_segment"]
    assert seg == pytest.approx((1.0253 + 1.1618) / 2, abs=1e-4)


def test_multi_row_sparse_segment_ids_and_empty_row():
    # Row 2 uses sparse, negative ids (-3, 1000) in interleaved order; row 3 has no valid token.
    delta = torch.tensor([DELTA, [0.2, 0.4, -0.2, 0.0], [5.0, 5.0, 5.0, 5.0]])
    mask = torch.tensor([[1.0] * 4, [1.0] * 4, [0.0] * 4])
    segments = torch.tensor([[0, 0, 1, 1], [-3, 1000, -3, 1000], [0, 1, 2, 3]])
    got = mismatch_log_ratio(delta, torch.zeros_like(delta), mask, "segment", segments=segments)
    # Row 2: segment -3 = mean(0.2, -0.2) = 0; segment 1000 = mean(0.4, 0.0) = 0.2.
    assert got.tolist() == [pytest.approx([0.025, 0.025, 0.15, 0.15]), pytest.approx([0.0, 0.2, 0.0, 0.2]),
                            [0.0] * 4]
    w = importance_weights(delta, torch.zeros_like(delta), mask, "sequence")
    assert w[2].tolist() == [1.0] * 4
    assert mismatch_filter(delta, torch.zeros_like(delta), mask, "token")[2].tolist() == [0.0] * 4
    empty = mismatch_metrics(delta, torch.zeros_like(delta), torch.zeros_like(mask))
    assert all(v == 0.0 for v in empty.values())


def test_unknown_level_raises():
    with pytest.raises(ValueError):
        mismatch_log_ratio(OLD, BEHAVIOUR, MASK, "chunk")


@pytest.mark.parametrize("seed", range(5))
def test_masked_positions_never_matter(seed):
    g = torch.Generator().manual_seed(seed)
    B, T = 4, 7
    old = -torch.rand(B, T, generator=g) * 2
    behaviour = old - 0.3 * torch.randn(B, T, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.35).float()
    mask[0] = 0.0                                          # one empty row
    segments = torch.randint(0, 3, (B, T), generator=g)
    off = mask == 0
    # Garbage off mask: huge, infinite and NaN log-probs and unrelated segment ids.
    old2 = torch.where(off, torch.tensor(float("nan")), old)
    behaviour2 = torch.where(off, torch.tensor(-float("inf")), behaviour)
    segments2 = torch.where(off, torch.randint(-50, 50, (B, T), generator=g), segments)
    for level in ("token", "segment", "geometric", "sequence"):
        for fn, kw in ((mismatch_log_ratio, {}), (importance_weights, {}),
                       (mismatch_filter, {"diff_low": -0.1, "diff_high": 0.1})):
            a = fn(old, behaviour, mask, level, segments=segments, **kw)
            b = fn(old2, behaviour2, mask, level, segments=segments2, **kw)
            assert torch.equal(a, b), (fn.__name__, level)
            if fn is mismatch_filter:
                assert bool((a <= mask).all())             # never keeps a token the input mask excluded
    assert mismatch_metrics(old, behaviour, mask, segments) == mismatch_metrics(old2, behaviour2, mask, segments2)
