"""DPO and its variants on hand-computed pairs (the arithmetic is written next to each expected value).

The worked pair: the policy gives the chosen response (2 tokens) log-prob -4 and the rejected one (3 tokens)
-6; the reference gives both -5. Summed log-ratios: chosen -4 - (-5) = +1, rejected -6 - (-5) = -1, so
h = 1 - (-1) = 2. Constants: log sigmoid(1) = -log(1 + e^-1) = -0.3132617, log sigmoid(-1) = -1.3132617.
"""

import math

import pytest
import torch

from gyre.algos.preference import PairLogps, PreferenceLossSpec, preference_loss

LS1 = -math.log1p(math.exp(-1.0))  # log sigmoid(1) = -0.31326169
LSM1 = -math.log1p(math.exp(1.0))  # log sigmoid(-1) = -1.31326169


def pair(chosen=-4.0, rejected=-6.0, chosen_tokens=2, rejected_tokens=3, grad=False):
    return PairLogps(torch.tensor([chosen], requires_grad=grad), torch.tensor([rejected], requires_grad=grad),
                     torch.tensor([float(chosen_tokens)]), torch.tensor([float(rejected_tokens)]))


REF = pair(-5.0, -5.0)


def run(spec, policy=None, reference=REF):
    out = preference_loss(policy or pair(), reference, spec)
    return out.losses.item(), out


def test_dpo_sigmoid_on_the_worked_pair():
    loss, out = run(PreferenceLossSpec("sigmoid", beta=0.5))
    assert loss == pytest.approx(-LS1, abs=1e-6)  # -log sigmoid(0.5 * 2) = 0.3132617
    # Rewards: beta * log-ratio = 0.5 * (+1) and 0.5 * (-1); margin 1; the chosen one wins.
    assert out.chosen_rewards.item() == pytest.approx(0.5) and out.rejected_rewards.item() == pytest.approx(-0.5)
    assert out.margins.item() == pytest.approx(1.0) and out.accuracies.item() == 1.0


def test_dpo_gradient_pushes_chosen_up_and_rejected_down():
    policy = pair(grad=True)
    preference_loss(policy, REF, PreferenceLossSpec("sigmoid", beta=0.5)).losses.sum().backward()
    # d/d pi_c of -log sigmoid(beta h) = -beta sigmoid(-beta h) = -0.5 * sigmoid(-1) = -0.5 * 0.2689414 = -0.1344707
    assert policy.chosen.grad.item() == pytest.approx(-0.1344707, abs=1e-6)
    assert policy.rejected.grad.item() == pytest.approx(+0.1344707, abs=1e-6)


def test_conservative_dpo_label_smoothing():
    loss, _ = run(PreferenceLossSpec("sigmoid", beta=0.5, label_smoothing=0.1))
    # -(0.9) log sigmoid(1) - 0.1 log sigmoid(-1) = 0.9 * 0.3132617 + 0.1 * 1.3132617 = 0.4132617
    assert loss == pytest.approx(-0.9 * LS1 - 0.1 * LSM1, abs=1e-6)
    assert loss == pytest.approx(0.4132617, abs=1e-6)


def test_robust_dpo():
    loss, _ = run(PreferenceLossSpec("robust", beta=0.5, label_smoothing=0.1))
    # (0.9 * 0.3132617 - 0.1 * 1.3132617) / (1 - 0.2) = (0.2819355 - 0.1313262) / 0.8 = 0.1882617
    assert loss == pytest.approx(0.1882617, abs=1e-6)
    # Without smoothing it is DPO.
    assert run(PreferenceLossSpec("robust", beta=0.5))[0] == pytest.approx(-LS1, abs=1e-6)


def test_hinge():
    # max(0, 1 - beta h): beta 0.25 -> 1 - 0.5 = 0.5; beta 0.5 -> 1 - 1 = 0 (the margin is met).
    assert run(PreferenceLossSpec("hinge", beta=0.25))[0] == pytest.approx(0.5)
    assert run(PreferenceLossSpec("hinge", beta=0.5))[0] == pytest.approx(0.0)


def test_ipo_uses_length_averaged_log_ratios():
    loss, out = run(PreferenceLossSpec("ipo", beta=0.5))
    # Per token: policy -4/2 = -2 and -6/3 = -2; reference -5/2 = -2.5 and -5/3 = -1.6667.
    # h = (-2 - (-2)) - (-2.5 - (-1.6667)) = 0.8333; (h - 1 / (2 * 0.5))^2 = (0.8333 - 1)^2 = 1/36.
    assert loss == pytest.approx(1 / 36, abs=1e-6)
    # Rewards over the same averages: 0.5 * (-2 + 2.5) = 0.25 and 0.5 * (-2 + 1.6667) = -0.1667.
    assert out.chosen_rewards.item() == pytest.approx(0.25) and out.rejected_rewards.item() == pytest.approx(-1 / 6)


def test_simpo_is_reference_free_and_length_averaged():
    spec = PreferenceLossSpec("simpo", beta=2.0, simpo_gamma=0.5)
    assert not spec.needs_reference
    loss, out = run(spec, pair(-4.0, -9.0, 2, 3), reference=None)
    # Averages -4/2 = -2 and -9/3 = -3: beta (a_c - a_r) - gamma = 2 * 1 - 0.5 = 1.5; -log sigmoid(1.5) = 0.2014133.
    assert loss == pytest.approx(math.log1p(math.exp(-1.5)), abs=1e-6)
    assert loss == pytest.approx(0.2014133, abs=1e-6)
    # Rewards: beta times the average log-prob, 2 * -2 and 2 * -3.
    assert out.chosen_rewards.item() == pytest.approx(-4.0) and out.rejected_rewards.item() == pytest.approx(-6.0)
    # A reference, if given, changes nothing.
    assert run(spec, pair(-4.0, -9.0, 2, 3))[0] == pytest.approx(loss)


def test_rpo_adds_the_chosen_per_token_nll():
    loss, out = run(PreferenceLossSpec("sigmoid", beta=0.5, rpo_alpha=0.5))
    # DPO 0.3132617 + alpha * (-(-4) / 2 tokens) = 0.3132617 + 0.5 * 2 = 1.3132617
    assert loss == pytest.approx(-LS1 + 1.0, abs=1e-6)
    assert out.nll.item() == pytest.approx(2.0)


def test_pairs_are_independent():
    two = PairLogps(torch.tensor([-4.0, -1.0]), torch.tensor([-6.0, -1.0]), torch.tensor([2.0, 1.0]),
                    torch.tensor([3.0, 1.0]))
    ref = PairLogps(torch.tensor([-5.0, -1.0]), torch.tensor([-5.0, -1.0]), two.chosen_tokens, two.rejected_tokens)
    out = preference_loss(two, ref, PreferenceLossSpec(beta=0.5))
    # The second pair matches the reference: h = 0, loss log 2, rewards 0, not an accuracy hit.
    assert out.losses.tolist() == pytest.approx([-LS1, math.log(2.0)], abs=1e-6)
    assert out.accuracies.tolist() == [1.0, 0.0]


def test_reference_needed_and_bad_specs():
    with pytest.raises(ValueError, match="needs the reference log-probs"):
        preference_loss(pair(), None, PreferenceLossSpec("sigmoid"))
    with pytest.raises(ValueError, match=r"label_smoothing must lie in \[0, 0.5\)"):
        PreferenceLossSpec(label_smoothing=0.5)
    with pytest.raises(ValueError, match="no meaning for loss_type 'ipo'"):
        PreferenceLossSpec("ipo", label_smoothing=0.1)
    with pytest.raises(ValueError, match="loss_type must be one of sigmoid, ipo, hinge, robust, simpo"):
        PreferenceLossSpec("kto")
    with pytest.raises(ValueError, match="beta must be positive"):
        PreferenceLossSpec(beta=0.0)
