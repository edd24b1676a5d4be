import math

import pytest
import torch

from gyre.algos import ppo_clip_loss
from gyre.algos.policy_loss import (
    cispo_loss,
    decoupled_ppo_loss,
    kimi15_loss,
    sequence_log_ratio,
    tis_loss,
    topr_loss,
    vanilla_pg_loss,
)


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


# ---------------------------------------------------------------------------------------------------------------
# Variants (reference algorithms.md section 5). Every check reads the coefficient c_t multiplying -A * dlogp.


def _coef_of(fn, ratio: float, adv: float, old: float = 0.0, **kw):
    """One token with rho = ratio: returns (loss, coefficient c_t, output)."""
    lp = torch.tensor([[old + math.log(ratio)]], requires_grad=True)
    out = fn(lp, torch.tensor([[old]]), torch.tensor([[adv]]), **kw)
    out.token_loss.sum().backward()
    return out.token_loss.item(), -lp.grad.item() / adv, out


@pytest.mark.parametrize("ratio,adv,c3,c14", [
    # Section 5.3 table, dual-clip columns: (loss, coef) for c = 3 and for ROLL's c = 1 + 2 * 0.2 = 1.4.
    # For A < 0 the loss is -max(min(rho A, clip(rho) A), c A), i.e. capped at c |A| with coef 0 there.
    (1.5, +1, (-1.2, 0.0), (-1.2, 0.0)),   # A > 0: dual clip never applies; upper clip as in PPO
    (0.5, +1, (-0.5, 0.5), (-0.5, 0.5)),
    (0.5, -1, (0.8, 0.0), (0.8, 0.0)),     # lower clip: -max(-0.8, -c) = 0.8 for both c
    (1.5, -1, (1.5, 1.5), (1.4, 0.0)),     # c = 3: -max(-1.5, -3) = 1.5; c = 1.4: -max(-1.5, -1.4) = 1.4, capped
    (5.0, -1, (3.0, 0.0), (1.4, 0.0)),     # both caps bind: loss = c |A|
    (1.1, +1, (-1.1, 1.1), (-1.1, 1.1)),
])
def test_dual_clip_worked_table(ratio, adv, c3, c14):
    for c, (loss, coef) in ((3.0, c3), (1.4, c14)):
        got_loss, got_coef, out = _coef_of(ppo_clip_loss, ratio, adv, dual_clip_c=c)
        assert got_loss == pytest.approx(loss, abs=1e-6)
        assert got_coef == pytest.approx(coef, abs=1e-6)
        # The cap (A < 0, rho > c) is reported as "ratio too high", like the upper clip for A > 0.
        capped = (adv < 0 and ratio > c) or (adv > 0 and ratio > 1.2)
        assert out.clipped_high.item() == float(capped)
        assert out.dropped is None


@pytest.mark.parametrize("c", [1.0, 0.5])
def test_dual_clip_rejects_c_not_above_one(c):
    with pytest.raises(ValueError):
        ppo_clip_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), dual_clip_c=c)


def test_ppo_mask_zeroes_loss_flags_and_gradient_off_mask():
    lp = torch.log(torch.tensor([[1.5, 1.1]])).requires_grad_()
    out = ppo_clip_loss(lp, torch.zeros(1, 2), torch.ones(1, 2), mask=torch.tensor([[0.0, 1.0]]))
    out.token_loss.sum().backward()
    assert out.token_loss[0, 0].item() == 0.0 and out.clipped_high.tolist() == [[0.0, 0.0]]
    assert lp.grad.tolist()[0] == pytest.approx([0.0, -1.1])


def _gspo(log_ratios, mask, adv, low=0.2, high=0.2):
    old = torch.full_like(log_ratios, -1.0)
    lp = (old + log_ratios).requires_grad_()
    out = ppo_clip_loss(lp, old, adv, low, high, ratio_level="sequence", mask=mask)
    out.token_loss.sum().backward()
    return out, lp.grad


def test_gspo_sequence_ratio_and_tiny_clip():
    # Section 5.4: log-ratios [0.1, -0.2, 0.4] -> masked mean 0.1 -> s = e^0.1 = 1.1052. The 4th token is
    # padding with a wild log-ratio (5.0): it must not enter s. With GSPO's 4e-4 upper clip and A > 0,
    # s > 1 + 4e-4 so every token is clipped: loss = -(1 + 4e-4) * A, coefficient 0.
    lr = torch.tensor([[0.1, -0.2, 0.4, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert sequence_log_ratio(lr, mask).tolist() == [[pytest.approx(0.1)]]
    out, grad = _gspo(lr, mask, torch.ones(1, 1), low=3e-4, high=4e-4)
    assert out.ratio.tolist()[0] == pytest.approx([math.exp(0.1)] * 4)
    assert out.token_loss.tolist()[0] == pytest.approx([-(1 + 4e-4)] * 3 + [0.0])
    assert grad.abs().sum().item() == 0.0
    assert out.clipped_high.tolist() == [[1.0, 1.0, 1.0, 0.0]]


def test_gspo_token_form_gives_every_token_the_sequence_coefficient():
    # Wide clip (0.2): s = 1.1052 is inside, so each valid token's loss is -s * A_t and its coefficient is s
    # (GSPO-token: d s_it / d logp_t = s_i), whatever its own token ratio; the padded token gets none.
    # Row 2: log-ratios [-0.3, 0.1] -> mean -0.1 -> s = e^-0.1 = 0.9048, inside; its 3rd/4th tokens are padding.
    lr = torch.tensor([[0.1, -0.2, 0.4, 5.0], [-0.3, 0.1, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    adv = torch.tensor([[1.0, 2.0, -1.0, 3.0], [-1.0, 0.5, 1.0, 1.0]])
    out, grad = _gspo(lr, mask, adv)
    s = torch.tensor([[math.exp(0.1)], [math.exp(-0.1)]])
    coef = -grad / adv
    assert torch.allclose(coef, s * mask, atol=1e-6)
    assert torch.allclose(out.token_loss, -s * adv * mask, atol=1e-6)


def test_gspo_requires_mask_and_unknown_level_raises():
    z = torch.zeros(1, 2)
    with pytest.raises(ValueError):
        ppo_clip_loss(z, z, z, ratio_level="sequence")
    with pytest.raises(ValueError):
        ppo_clip_loss(z, z, z, ratio_level="segment", mask=z)


def test_sequence_log_ratio_empty_row_is_zero():
    assert sequence_log_ratio(torch.tensor([[float("nan"), 1.0]]), torch.zeros(1, 2)).tolist() == [[0.0]]


def test_vanilla_coefficient_is_one():
    # loss = -A * logp: logp = log 1.5 (old is irrelevant), A = 2 -> -2 log 1.5; c = 1.
    lp = torch.tensor([[math.log(1.5)]], requires_grad=True)
    out = vanilla_pg_loss(lp, torch.tensor([[2.0]]))
    out.token_loss.sum().backward()
    assert out.token_loss.item() == pytest.approx(-2 * math.log(1.5))
    assert -lp.grad.item() / 2.0 == pytest.approx(1.0)
    assert out.ratio.tolist() == [[1.0]]


@pytest.mark.parametrize("ratio,coef,high", [
    (1.5, 1.0, 1.0),   # Section 5.5: clip(1.5, 0, 1) = 1.0, down-weighted but not zeroed
    (0.5, 0.5, 0.0),   # clip(0.5, 0, 1) = 0.5
])
def test_tis_truncated_weight(ratio, coef, high):
    # loss = -w * A * logp with old = 0, so logp = log(rho): loss = -w * log(rho) for A = +1.
    loss, got, out = _coef_of(tis_loss, ratio, +1.0)
    assert got == pytest.approx(coef)
    assert loss == pytest.approx(-coef * math.log(ratio))
    assert out.clipped_high.item() == high
    # The sign of A does not change the weight.
    assert _coef_of(tis_loss, ratio, -1.0)[1] == pytest.approx(coef)


def test_topr_split_by_sequence_sign():
    # Row 1 is in T+ (weight w+ = 2, no IS): c = 2 whatever rho. Row 2 is in T- (w- = 0.5):
    # c = 0.5 * min(rho, 1) -> rho = 1.5: 0.5; rho = 0.5: 0.25.
    ratios = torch.tensor([[1.5, 0.5], [1.5, 0.5]])
    adv = torch.tensor([[1.0], [-1.0]])
    for positive in (torch.tensor([True, False]), torch.tensor([[True], [False]])):
        lp = torch.log(ratios).requires_grad_()
        out = topr_loss(lp, torch.zeros(2, 2), adv, positive, positive_weight=2.0, negative_weight=0.5)
        out.token_loss.sum().backward()
        assert (-lp.grad / adv).tolist() == [[2.0, 2.0], [0.5, 0.25]]
        assert out.clipped_high.tolist() == [[0.0, 0.0], [1.0, 0.0]]


@pytest.mark.parametrize("ratio,adv,weight,masked", [
    # Section 5.7 example, eps = 0.1: weight = clip(rho, 0.9, 1.1).
    (1.5, +1, 1.1, True),    # unified mask: A > 0 and rho > 1.1
    (0.5, -1, 0.9, True),    # unified mask: A < 0 and rho < 0.9
    (0.5, +1, 0.9, False),   # kept, weight 0.9
    (5.0, -1, 1.1, False),   # kept: PPO would zero this "fork" token, CISPO keeps weight 1.1
])
def test_cispo_worked_example(ratio, adv, weight, masked):
    loss, coef, out = _coef_of(cispo_loss, ratio, adv)
    assert coef == pytest.approx(weight) and out.dropped is None
    assert loss == pytest.approx(-weight * adv * math.log(ratio))
    assert out.clipped_high.item() == float(ratio > 1.1) and out.clipped_low.item() == float(ratio < 0.9)
    loss, coef, out = _coef_of(cispo_loss, ratio, adv, unified_mask=True)
    assert coef == pytest.approx(0.0 if masked else weight)
    assert loss == pytest.approx(0.0 if masked else -weight * adv * math.log(ratio))
    assert out.dropped.item() == float(masked)


def test_kimi15_regulariser():
    # Section 5.8: log-ratio 0.2, tau = 0.1 -> (0.1 / 2) * 0.2^2 = 0.002. With old = -1, logp = -0.8, A = 1:
    # loss = -1 * (-0.8) + 0.002 = 0.802; dloss/dlogp = -A + tau * 0.2 = -0.98 -> c = 0.98.
    loss, coef, _ = _coef_of(kimi15_loss, math.exp(0.2), 1.0, old=-1.0)
    assert loss == pytest.approx(0.802)
    assert coef == pytest.approx(0.98)


@pytest.mark.parametrize("cap,w", [(None, 2.0), (1.5, 1.5), (3.0, 2.0)])
def test_decoupled_ppo_behaviour_weight_and_cap(cap, w):
    # pi_prox / mu = exp(0 - log 0.5) = 2, capped at behaviour_cap when set. r = pi_theta / pi_prox.
    # r = 1.1, A = +1 (inside): loss = -w * 1.1, c = w * 1.1.  r = 1.5, A = +1: clipped -> loss = -w * 1.2, c = 0.
    prox, behaviour = torch.zeros(1, 2), torch.full((1, 2), math.log(0.5))
    lp = torch.log(torch.tensor([[1.1, 1.5]])).requires_grad_()
    out = decoupled_ppo_loss(lp, prox, behaviour, torch.ones(1, 2), behaviour_cap=cap)
    out.token_loss.sum().backward()
    assert out.token_loss.tolist()[0] == pytest.approx([-w * 1.1, -w * 1.2])
    assert (-lp.grad).tolist()[0] == pytest.approx([w * 1.1, 0.0])
    assert out.ratio.tolist()[0] == pytest.approx([1.1, 1.5])
    assert out.clipped_high.tolist() == [[0.0, 1.0]]


def test_ratio_is_detached_everywhere():
    lp = torch.zeros(2, 3, requires_grad=True)
    z, a, mask = torch.zeros(2, 3), torch.ones(2, 1), torch.ones(2, 3)
    outs = [
        ppo_clip_loss(lp, z, a), ppo_clip_loss(lp, z, a, ratio_level="sequence", mask=mask),
        vanilla_pg_loss(lp, a), tis_loss(lp, z, a), topr_loss(lp, z, a, torch.tensor([True, False])),
        cispo_loss(lp, z, a, unified_mask=True), kimi15_loss(lp, z, a), decoupled_ppo_loss(lp, z, z, a),
    ]
    for out in outs:
        assert out.token_loss.shape == (2, 3) and out.ratio.shape == (2, 3)
        assert not out.ratio.requires_grad and out.clipped_low.shape == out.clipped_high.shape == (2, 3)
        assert out.token_loss.requires_grad
