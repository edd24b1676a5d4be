import math

import pytest
import torch

from gyre.algos.distill import distill_advantages, distill_loss_tokens, reverse_kl_tokens


def _example():
    # Student and teacher log-probs of three sampled tokens of one row, the fourth position padding.
    student = torch.tensor([[math.log(0.5), math.log(0.2), math.log(0.9), float("nan")]])
    teacher = torch.tensor([[math.log(0.25), math.log(0.4), math.log(0.9), float("-inf")]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    return student, teacher, mask


def test_reverse_kl_is_the_log_ratio_of_the_sampled_token():
    student, teacher, mask = _example()
    # log(0.5/0.25) = ln 2 = 0.6931; log(0.2/0.4) = -ln 2; log(0.9/0.9) = 0; padding 0 despite NaN/-inf.
    d = reverse_kl_tokens(student, teacher, mask)
    assert d.tolist()[0] == pytest.approx([0.693147, -0.693147, 0.0, 0.0], abs=1e-6)


def test_pure_advantage_is_minus_coef_times_the_log_ratio():
    student, teacher, mask = _example()
    rl = torch.tensor([[5.0, 5.0, 5.0, 5.0]])
    adv = distill_advantages(rl, student, teacher, mask, coef=0.5, pure=True)
    # -0.5 * [ln 2, -ln 2, 0] = [-0.3466, 0.3466, 0]: the task advantage (5) is not used.
    assert adv.tolist()[0] == pytest.approx([-0.346574, 0.346574, 0.0, 0.0], abs=1e-6)


def test_mixed_advantage_subtracts_the_scaled_kl_from_the_rl_advantage():
    student, teacher, mask = _example()
    rl = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    adv = distill_advantages(rl, student, teacher, mask, coef=2.0, pure=False)
    # 1 - 2 * [ln 2, -ln 2, 0] = [-0.3863, 2.3863, 1]
    assert adv.tolist()[0] == pytest.approx([-0.386294, 2.386294, 1.0, 0.0], abs=1e-6)


def test_loss_term_value_and_gradient_by_hand():
    lp = torch.tensor([[math.log(0.5), math.log(0.2)]], requires_grad=True)
    teacher = torch.tensor([[math.log(0.25), math.log(0.4)]])
    loss = distill_loss_tokens(lp, teacher, torch.ones(1, 2))
    # 1/2 (ln 2)^2 = 0.240227 on both tokens; d/dlp = lp - teacher = [ln 2, -ln 2].
    assert loss.tolist()[0] == pytest.approx([0.240227, 0.240227], abs=1e-6)
    loss.sum().backward()
    assert lp.grad.tolist()[0] == pytest.approx([0.693147, -0.693147], abs=1e-6)


def test_loss_term_expected_gradient_is_the_reverse_kl_gradient():
    """Over every token y of a 5-token vocabulary, weighted by pi_theta(y) (the expectation over the
    student's samples), the loss's gradient equals the exact grad KL(pi_theta || pi_teacher)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, generator=g, dtype=torch.float64, requires_grad=True)
    teacher = torch.log_softmax(torch.randn(5, generator=g, dtype=torch.float64), dim=-1)
    logp = torch.log_softmax(logits, dim=-1)
    expected = (logp.exp().detach() * distill_loss_tokens(logp, teacher, torch.ones(5))).sum()
    (grad_loss,) = torch.autograd.grad(expected, logits, retain_graph=True)
    kl = (logp.exp() * (logp - teacher)).sum()
    (grad_kl,) = torch.autograd.grad(kl, logits)
    assert torch.allclose(grad_loss, grad_kl, atol=1e-12)
    assert grad_kl.abs().max() > 1e-3  # not trivially zero


def test_advantage_mode_expected_policy_gradient_is_minus_the_reverse_kl_gradient():
    """The pure advantage -d_t in a REINFORCE gradient, sum_y pi(y) A(y) grad log pi(y), ascends -KL."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    teacher = torch.log_softmax(torch.randn(4, generator=g, dtype=torch.float64), dim=-1)
    logp = torch.log_softmax(logits, dim=-1)
    adv = distill_advantages(torch.zeros(4, dtype=torch.float64), logp, teacher, torch.ones(4), 1.0, pure=True)
    (pg,) = torch.autograd.grad((logp.exp().detach() * adv * logp).sum(), logits, retain_graph=True)
    (grad_kl,) = torch.autograd.grad((logp.exp() * (logp - teacher)).sum(), logits)
    assert torch.allclose(pg, -grad_kl, atol=1e-12)
