"""NaN and inf in padding reach no loss, no estimate and no gradient: every registered loss and estimator.

Each case runs twice, once with padding filled with NaN / inf and once with zeros; the results (and the
gradients) must be equal, finite, and 0 off the mask. A product with the mask would fail here (NaN * 0 is
NaN, and so is the gradient 0 * NaN); a selection passes.
"""

import math

import pytest
import torch

from gyre.algos.agentic import TurnBatch
from gyre.algos.aggregation import LossDenominator, aggregate_loss, denominator_for
from gyre.algos.estimator_table import ESTIMATORS, AdvantageSpec
from gyre.algos.kl import kl_penalized_rewards
from gyre.algos.loss_table import POLICY_LOSSES, PolicyLossSpec
from gyre.algos.mismatch import importance_weights, mismatch_filter, mismatch_metrics
from gyre.algos.policy_loss import PolicyLossInputs
from gyre.algos.stats import masked_whiten
from gyre.algos.value import explained_variance, value_loss

NAN, INF = math.nan, math.inf
MASK = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
VALID = MASK > 0
AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def padded(valid_values: list[list[float]], fill: float) -> torch.Tensor:
    """[2, 4] float64 with ``valid_values`` on MASK's valid entries (row by row) and ``fill`` elsewhere."""
    out = torch.full(MASK.shape, fill, dtype=torch.float64)
    for row, values in enumerate(valid_values):
        out[row, :len(values)] = torch.tensor(values, dtype=torch.float64)
    return out


LOGPROBS = [[-0.5, -1.2], [-0.3, -2.0, -0.9]]
OLD = [[-0.6, -1.0], [-0.3, -2.4, -0.8]]
BEHAVIOUR = [[-0.7, -1.1], [-0.2, -2.2, -0.8]]
ADVANTAGES = [[1.0, 1.0], [-0.5, -0.5, -0.5]]


def loss_inputs(fill: float) -> PolicyLossInputs:
    return PolicyLossInputs(logprobs=padded(LOGPROBS, fill).requires_grad_(True), old_logprobs=padded(OLD, -fill),
                            advantages=padded(ADVANTAGES, fill), mask=MASK.double(),
                            behaviour_logprobs=padded(BEHAVIOUR, fill), scores=torch.tensor([1.0, 0.0]))


@pytest.mark.parametrize("name,ratio_level", [(n, "token") for n in POLICY_LOSSES.names] + [
    (n, "sequence") for n in POLICY_LOSSES.names if POLICY_LOSSES.get(n).sequence_ratio])
def test_every_policy_loss_ignores_nan_padding(name, ratio_level):
    spec = PolicyLossSpec(variant=name, ratio_level=ratio_level)
    denom = LossDenominator(tokens=5, sequences=2, norm_length=4)
    results = []
    for fill in (0.0, NAN, INF):
        x = loss_inputs(fill)
        out = POLICY_LOSSES.get(name).loss(x.on_mask(), spec, spec.knobs)
        loss = sum(aggregate_loss(out.token_loss, MASK, mode, denom) for mode in AGG_MODES)
        loss.backward()
        assert math.isfinite(loss.item()) and torch.isfinite(x.logprobs.grad).all(), fill
        assert (x.logprobs.grad[~VALID] == 0).all()
        results.append((loss.item(), x.logprobs.grad))
    for loss, grad in results[1:]:
        assert loss == pytest.approx(results[0][0], abs=1e-12)
        assert torch.allclose(grad, results[0][1], atol=1e-12)


def test_ppo_with_its_mask_ignores_nan_padding_without_help():
    # ppo_clip_loss takes the mask itself: called directly, it selects its own inputs.
    from gyre.algos.policy_loss import ppo_clip_loss
    for ratio_level in ("token", "sequence"):
        x = loss_inputs(NAN)
        out = ppo_clip_loss(x.logprobs, x.old_logprobs, x.advantages, ratio_level=ratio_level, mask=MASK)
        out.token_loss.sum().backward()
        assert torch.isfinite(out.token_loss).all() and torch.isfinite(x.logprobs.grad).all()
        assert (out.token_loss[~VALID] == 0).all() and (out.clipped_high[~VALID] == 0).all()


def turn_batch(fill: float) -> TurnBatch:
    rewards = torch.tensor([[0.0, 1.0, fill], [0.5, 0.0, 1.0], [1.0, fill, fill]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    states = torch.tensor([[0, 1, 99], [0, 2, 3], [0, 98, 97]])
    return TurnBatch(rewards, mask, torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64), torch.tensor([0, 0, 0]),
                     states)


@pytest.mark.parametrize("name", ESTIMATORS.names)
def test_every_estimator_ignores_nan_padding(name):
    estimator = ESTIMATORS.get(name)
    spec = AdvantageSpec(estimator=name, gamma=0.9)  # GAE's lambda 0.95, GiGPO's knobs: their defaults
    results = []
    for fill in (0.0, NAN, INF, -INF):
        if estimator.turns is not None:
            out = estimator.turns(turn_batch(fill), spec)
            mask = turn_batch(0.0).mask
        else:
            rewards = padded([[0.0, 1.0], [0.0, 0.0, 0.5]], fill)
            values = padded([[0.2, 0.4], [0.1, 0.3, 0.2]], fill) if estimator.critic else None
            out, returns = estimator.advantages(rewards, values, MASK, spec)
            mask = MASK
            if returns is not None:
                assert torch.isfinite(returns).all()
        assert torch.isfinite(out).all() and (out[mask == 0] == 0).all(), fill
        results.append(out)
    for out in results[1:]:
        assert torch.allclose(out, results[0], atol=1e-12)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_aggregation_selects_the_token_losses(mode):
    # token losses [1, 3] and [2, 2, 2] (the reference's example, shortened); padding NaN and inf.
    denom = LossDenominator(tokens=5, sequences=2, norm_length=4)
    want = {"token-mean": 10 / 5, "seq-mean-token-sum": 10 / 2, "seq-mean-token-mean": (2 + 2) / 2,
            "seq-mean-token-sum-norm": 10 / 8}[mode]
    for fill in (NAN, INF):
        losses = padded([[1.0, 3.0], [2.0, 2.0, 2.0]], fill).requires_grad_(True)
        loss = aggregate_loss(losses, MASK, mode, denom)
        loss.backward()
        assert loss.item() == pytest.approx(want)
        assert torch.isfinite(losses.grad).all() and (losses.grad[~VALID] == 0).all()


def test_reductions_and_stages_ignore_nan_padding():
    clean = padded([[0.3, -0.2], [0.1, 0.4, -0.5]], 0.0)
    dirty = padded([[0.3, -0.2], [0.1, 0.4, -0.5]], NAN)
    # whitening, the value loss and the explained variance
    assert torch.equal(masked_whiten(dirty, MASK), masked_whiten(clean, MASK))
    assert explained_variance(dirty, dirty * 0.5, MASK) == explained_variance(clean, clean * 0.5, MASK)
    values = clean.clone().requires_grad_(True)
    loss, _ = value_loss(values, clean, clean * 2, clip=0.2)
    assert aggregate_loss(loss, MASK, "token-mean", denominator_for(MASK)).item() == pytest.approx(
        0.5 * (0.09 + 0.04 + 0.01 + 0.16 + 0.25) / 5)  # (V - R)^2 / 2 with R = 2V: V^2 / 2
    # the KL reward penalty (a -inf reference log-prob on padding)
    reward = padded([[0.0, 1.0], [0.0, 0.0, 0.0]], 0.0)
    got, kl = kl_penalized_rewards(reward, padded(LOGPROBS, 0.0), padded(OLD, -INF), MASK, coef=0.1)
    want, _ = kl_penalized_rewards(reward, padded(LOGPROBS, 0.0), padded(OLD, 0.0), MASK, coef=0.1)
    assert torch.equal(got, want) and torch.isfinite(kl).all()
    # mismatch weights, filter and metrics (NaN old log-probs, -inf behaviour log-probs on padding)
    args_dirty = (padded(OLD, NAN), padded(BEHAVIOUR, -INF), MASK)
    args_clean = (padded(OLD, 0.0), padded(BEHAVIOUR, 0.0), MASK)
    for level in ("token", "segment", "geometric", "sequence"):
        assert torch.equal(importance_weights(*args_dirty, level), importance_weights(*args_clean, level))
        assert torch.equal(mismatch_filter(*args_dirty, level, diff_low=-0.2, diff_high=0.2),
                           mismatch_filter(*args_clean, level, diff_low=-0.2, diff_high=0.2))
    assert mismatch_metrics(*args_dirty) == mismatch_metrics(*args_clean)
