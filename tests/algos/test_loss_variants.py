"""Clip-Cov, KL-Cov, GMPO and SAPO against arithmetic written out here; NaN padding reaches neither loss nor
gradient."""

import math

import pytest
import torch

from gyre.algos.aggregation import LossDenominator, aggregate_loss
from gyre.algos.loss_variants import clip_cov_loss, gmpo_loss, kl_cov_loss, sapo_loss, token_covariance

NAN = float("nan")
# Four valid tokens and one padded one holding NaN. log pi = [-1, -2, -0.5, -3], per-token A = [2, -1, 1, 0]:
#   mean log pi = -1.625, mean A = 0.5
#   Cov = (log pi + 1.625)(A - 0.5) = [0.625 * 1.5, -0.375 * -1.5, 1.125 * 0.5, -1.375 * -0.5]
#       = [0.9375, 0.5625, 0.5625, 0.6875]
LP = [-1.0, -2.0, -0.5, -3.0, NAN]
ADV = torch.tensor([[2.0, -1.0, 1.0, 0.0, NAN]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])


def logprobs():
    return torch.tensor([LP], dtype=torch.float64, requires_grad=True)


def test_token_covariance():
    cov = token_covariance(torch.tensor([LP]), ADV, MASK)
    assert cov[0].tolist() == pytest.approx([0.9375, 0.5625, 0.5625, 0.6875, 0.0])


def test_clip_cov_detaches_a_covariance_band_but_not_what_ppo_clipped():
    # Token 0 has rho = 1.5 > 1 + 0.2 with A > 0: PPO clips it (loss -A * 1.2 = -2.4, no gradient), so it is
    # no candidate although its Cov 0.9375 is in the band (0.6, 5). Token 3 (Cov 0.6875) is the only one:
    # detached. r = 0.5 of 4 valid tokens asks for 2, at least one and at most the candidates.
    lp = logprobs()
    old = torch.tensor([[-1.0 - math.log(1.5), -2.0, -0.5, -3.0, NAN]], dtype=torch.float64)
    out = clip_cov_loss(lp, old, ADV, MASK, 0.2, 0.2, select_ratio=0.5, cov_low=0.6, cov_high=5.0)
    assert out.token_loss[0].tolist() == pytest.approx([-2.4, 1.0, -1.0, 0.0, 0.0])
    assert out.dropped[0].tolist() == [0, 0, 0, 1, 0] and out.clipped_high[0].tolist() == [1, 0, 0, 0, 0]
    out.token_loss.sum().backward()
    # d(-A rho)/d log pi = -A rho on the tokens that train: token 1: +1, token 2: -1; 0 elsewhere, padding too.
    assert lp.grad[0].tolist() == [0.0, 1.0, -1.0, 0.0, 0.0]


def test_clip_cov_draws_r_n_tokens_among_the_candidates():
    # Ratio 1 everywhere: candidates in (0.6, 5) are tokens 0 and 3; r = 0.25 of 4 asks for exactly one.
    lp = torch.tensor([LP], dtype=torch.float64)
    seen = set()
    for seed in range(20):
        draw = torch.Generator().manual_seed(seed)
        out = clip_cov_loss(lp, lp, ADV, MASK, select_ratio=0.25, cov_low=0.6, generator=draw)
        dropped = out.dropped[0].nonzero().flatten().tolist()
        assert len(dropped) == 1 and dropped[0] in (0, 3)
        seen.add(dropped[0])
    assert seen == {0, 3}  # a random draw, not a fixed rule
    # The authors' band (1, 5) holds no token here: plain PPO.
    assert clip_cov_loss(lp, lp, ADV, MASK).dropped.sum() == 0


def test_kl_cov_penalises_the_top_covariance_tokens():
    # k = 0.25 of 4 tokens -> 1 token, the largest Cov: token 0 (0.9375). Its log-ratio 0.2 (rho = e^0.2):
    #   loss_0 = -A rho + beta |log rho| = -2 * 1.221403 + 0.5 * 0.2 = -2.342806
    #   the others at rho = 1: -A = [1, -1, -0]
    lp = logprobs()
    old = torch.tensor([[-1.2, -2.0, -0.5, -3.0, NAN]], dtype=torch.float64)
    out = kl_cov_loss(lp, old, ADV, MASK, select_ratio=0.25, coef=0.5)
    assert out.token_loss[0].tolist() == pytest.approx([-2.342806, 1.0, -1.0, 0.0, 0.0], abs=1e-6)
    assert out.penalised[0].tolist() == [1, 0, 0, 0, 0]
    out.token_loss.sum().backward()
    # token 0: -A rho + beta sign(log rho) = -2.442806 + 0.5; others -A rho
    assert lp.grad[0].tolist() == pytest.approx([-1.942806, 1.0, -1.0, 0.0, 0.0], abs=1e-6)


def test_gmpo_value_and_gradient_match_the_geometric_mean_objective():
    # Row 0: A = +1, log-ratios [0.1, 0.6, -0.5], clip 0.4 on both sides: A > 0 clips from above ->
    #   c = [0.1, 0.4, -0.5], mean 0 -> ratio e^0 = 1, loss -1 on every token.
    # Row 1: A = -1, log-ratios [-0.6, 0.2] and a NaN pad: A < 0 clips from below -> c = [-0.4, 0.2],
    #   mean -0.1 -> ratio e^-0.1 = 0.904837, loss +0.904837.
    lp = torch.tensor([[0.1, 0.6, -0.5], [-0.6, 0.2, NAN]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(2, 3, dtype=torch.float64)
    adv, mask = torch.tensor([[1.0], [-1.0]]), torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    out = gmpo_loss(lp, old, adv, mask, 0.4, 0.4)
    assert out.token_loss.tolist() == [pytest.approx([-1.0, -1.0, -1.0]), pytest.approx([0.904837, 0.904837, 0.0])]
    assert out.clipped_high[0].tolist() == [0, 1, 0] and out.clipped_low[1].tolist() == [1, 0, 0]
    loss = aggregate_loss(out.token_loss, mask, "seq-mean-token-mean", LossDenominator(tokens=5, sequences=2))
    assert loss.item() == pytest.approx((-1.0 + math.exp(-0.1)) / 2)
    loss.backward()
    # The paper's objective, autograd of the exact formula: mean_i -A_i exp(mean_t sgn min(sgn d, sgn clip d)).
    ref = torch.tensor([[0.1, 0.6, -0.5], [-0.6, 0.2, 0.0]], dtype=torch.float64, requires_grad=True)
    objective = 0.0
    for i, (a, n) in enumerate(((1.0, 3), (-1.0, 2))):
        d = ref[i, :n]
        c = a * torch.minimum(a * d, a * d.clamp(-0.4, 0.4))
        objective = objective - a * torch.exp(c.mean()) / 2
    objective.backward()
    assert torch.allclose(lp.grad, ref.grad)
    # By hand: row 0 -(1/2)(1/3) e^0 on the unclipped tokens; row 1 +(1/2)(1/2) e^-0.1 = 0.226209 on its unclipped one.
    assert lp.grad.tolist() == [pytest.approx([-1 / 6, 0.0, -1 / 6]), pytest.approx([0.0, math.exp(-0.1) / 4, 0.0])]


def test_sapo_soft_gate():
    # f(x) = sigmoid(tau (x - 1)) * 4 / tau; the coefficient on -A grad log pi is 4 s (1 - s) rho.
    lp = torch.tensor([[0.0, 0.5, -0.5, NAN]], dtype=torch.float64, requires_grad=True)
    adv, mask = torch.tensor([[1.0, 1.0, -1.0, NAN]]), torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    out = sapo_loss(lp, torch.zeros(1, 4, dtype=torch.float64), adv, mask, tau_pos=1.0, tau_neg=1.05)

    def sig(x):
        return 1 / (1 + math.exp(-x))
    s1 = sig(math.exp(0.5) - 1)                      # A > 0, rho = e^0.5, tau 1: s = 0.656722
    s2 = sig(1.05 * (math.exp(-0.5) - 1))            # A < 0, rho = e^-0.5, tau 1.05: s = 0.398159
    assert (s1, s2) == (pytest.approx(0.656722, abs=1e-6), pytest.approx(0.398159, abs=1e-6))
    # on-policy: -sigmoid(0) * 4 = -2; then -4 s1; then +4 s2 / 1.05
    assert out.token_loss[0].tolist() == pytest.approx([-2.0, -4 * s1, 4 * s2 / 1.05, 0.0])
    out.token_loss.sum().backward()
    # gradients: -A * 4 s (1 - s) rho: on-policy exactly -1 (the plain policy gradient), then the decayed ones
    want = [-1.0, -4 * s1 * (1 - s1) * math.exp(0.5), 4 * s2 * (1 - s2) * math.exp(-0.5), 0.0]
    assert lp.grad[0].tolist() == pytest.approx(want)
    assert want[1] == pytest.approx(-1.486739, abs=1e-6) and want[2] == pytest.approx(0.581368, abs=1e-6)


@pytest.mark.parametrize("loss", [clip_cov_loss, kl_cov_loss, gmpo_loss, sapo_loss])
def test_inf_and_nan_padding_stay_out(loss):
    lp = torch.tensor([[-1.0, -2.0, -torch.inf], [-0.5, NAN, NAN]], requires_grad=True)
    old = torch.tensor([[-1.1, -1.9, NAN], [-0.4, -torch.inf, NAN]])
    adv, mask = torch.tensor([[1.0], [-1.0]]), torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    out = loss(lp, old, adv, mask)
    out.token_loss.sum().backward()
    assert torch.isfinite(out.token_loss).all() and torch.isfinite(lp.grad).all()
    assert out.token_loss[mask == 0].abs().sum() == 0 and lp.grad[mask == 0].abs().sum() == 0
