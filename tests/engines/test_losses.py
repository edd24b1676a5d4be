import math

import pytest
import torch

from gyre.algos import POLICY_LOSSES, LossDenominator
from gyre.algos.loss_table import PpoKnobs
from gyre.algos.specs import KLSpec
from gyre.engines.losses import PolicyLoss, PolicyLossSpec, SFTLoss, ValueLoss
from gyre.types import MetricSums, TrainBatch


def batch():
    # One sequence: a prompt token, then two response tokens (positions 1 and 2).
    return TrainBatch(
        input_ids=torch.tensor([[5, 6, 7]]), attention_mask=torch.ones(1, 3, dtype=torch.long),
        response_mask=torch.tensor([[0.0, 1.0, 1.0]]), advantages=torch.tensor([[0.0, 1.0, 1.0]]),
        rollout_logprobs=torch.tensor([[0.0, -1.1, -2.2]]), old_logprobs=torch.tensor([[0.0, -1.0, -2.0]]),
        ref_logprobs=None)


def current():
    # ratios to pi_old: 1.5 and 0.5
    return torch.tensor([[0.0, -1.0 + math.log(1.5), -2.0 + math.log(0.5)]], requires_grad=True)


def test_grpo_loss_hand_computed():
    b = batch()
    lp = current()
    b.ref_logprobs = lp.detach() - torch.tensor([[0.0, 0.5, -0.5]])  # log pi - log ref = +0.5, -0.5
    entropy = torch.tensor([[0.0, 2.0, 1.0]])
    spec = PolicyLossSpec(clip_low=0.2, clip_high=0.2, kl=KLSpec(loss_coef=0.1), entropy_coef=0.01,
                          old_source="recomputed")
    metrics = MetricSums()
    loss = PolicyLoss(LossDenominator(tokens=2), spec)(b, lp, entropy, metrics)
    # PPO: -min(1.5, 1.2) = -1.2 and -min(0.5, 0.5) = -0.5 -> token-mean -0.85
    # KL k3: exp(-0.5) - 0.5 = 0.10653, exp(0.5) - 1.5 = 0.14872 -> mean 0.12763, x 0.1 = 0.012763
    # entropy: mean(2, 1) = 1.5, x 0.01 = 0.015 (subtracted)
    assert loss.item() == pytest.approx(-0.85 + 0.012763 - 0.015, abs=1e-5)
    m = metrics.means()
    assert m["clip_frac_high"] == 0.5 and m["clip_frac_low"] == 0.0 and m["clip_frac"] == 0.5
    assert m["ratio_mean"] == pytest.approx(1.0)
    # approx KL(old || new), k3 with d = old - new: 1.5 - 1 - ln 1.5 = 0.09453; 0.5 - 1 + ln 2 = 0.19315
    assert m["approx_kl"] == pytest.approx((0.09453 + 0.19315) / 2, abs=1e-4)
    assert m["kl_ref"] == pytest.approx(0.12763, abs=1e-4) and m["entropy"] == pytest.approx(1.5)
    assert m["logprob_mismatch"] == pytest.approx(0.15)  # |old - rollout| = 0.1, 0.2
    loss.backward()
    # d/dlogp: the clipped token has no PPO gradient; the other gets -rho*A = -0.5 (/2 tokens) plus KL.
    assert lp.grad[0, 1].item() == pytest.approx(0.1 * (1 - math.exp(-0.5)) / 2, abs=1e-6)
    assert lp.grad[0, 2].item() == pytest.approx(-0.5 / 2 + 0.1 * (1 - math.exp(0.5)) / 2, abs=1e-6)


@pytest.mark.parametrize("source,expected", [
    ("current", -1.0),     # ratio 1 everywhere: -A averaged
    ("rollout", None),     # pi_old from the sampler's log-probs
])
def test_old_logprob_sources(source, expected):
    b = batch()
    lp = current()
    loss = PolicyLoss(LossDenominator(tokens=2), PolicyLossSpec(old_source=source))(b, lp, None, MetricSums())
    if expected is None:
        # ratios exp(-1 + ln1.5 + 1.1) = 1.6578 -> clipped to 1.2; exp(-2 + ln 0.5 + 2.2) = 0.6107
        expected = -(1.2 + 0.5 * math.exp(0.2)) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-5)


def test_dp_ranks_scale_by_global_tokens():
    b = batch()
    one = PolicyLoss(LossDenominator(tokens=2), PolicyLossSpec())(b, current(), None, MetricSums())
    two = PolicyLoss(LossDenominator(tokens=4, dp_size=2), PolicyLossSpec())(b, current(), None, MetricSums())
    assert two.item() == pytest.approx(one.item())  # 2 ranks x 2 tokens each: same per-token weight


def test_sft_loss_is_token_mean_nll():
    b = batch()
    lp = torch.tensor([[0.0, -1.0, -3.0]])
    metrics = MetricSums()
    assert SFTLoss(LossDenominator(tokens=2))(b, lp, None, metrics).item() == pytest.approx(2.0)
    assert metrics.means()["sft_loss"] == pytest.approx(2.0)


def test_token_weights_scale_each_token_loss():
    # Mismatch importance weights [2, 0.5] on the PPO token losses -1.2 and -0.5: (-2.4 - 0.25) / 2
    b = batch()
    b.token_weights = torch.tensor([[1.0, 2.0, 0.5]])
    loss = PolicyLoss(LossDenominator(tokens=2), PolicyLossSpec())(b, current(), None, MetricSums())
    assert loss.item() == pytest.approx((-2.4 - 0.25) / 2, abs=1e-6)


def test_topr_splits_on_the_sample_score():
    # Positive sample: -A logp with no ratio -> -(1 * (-1 + ln1.5) + 1 * (-2 + ln0.5)) / 2 tokens.
    b = batch()
    b.scores = torch.tensor([1.0])
    lp = current()
    spec = PolicyLossSpec(variant="topr")
    loss = PolicyLoss(LossDenominator(tokens=2), spec)(b, lp, None, MetricSums())
    assert loss.item() == pytest.approx(-((-1 + math.log(1.5)) + (-2 + math.log(0.5))) / 2, abs=1e-6)
    # Non-positive sample: the weight is sg(clip(rho, 0, 1)) = [1, 0.5].
    b.scores = torch.tensor([0.0])
    loss = PolicyLoss(LossDenominator(tokens=2), spec)(b, lp, None, MetricSums())
    assert loss.item() == pytest.approx(-((-1 + math.log(1.5)) + 0.5 * (-2 + math.log(0.5))) / 2, abs=1e-6)


def test_sequence_mean_aggregation_in_the_step_loss():
    # seq-mean-token-mean over one sequence of two tokens equals token-mean; with 2 sequences in the
    # optimizer step (the other on another micro-batch) this micro-batch contributes half.
    spec = PolicyLossSpec(agg="seq-mean-token-mean")
    loss = PolicyLoss(LossDenominator(tokens=2, sequences=2), spec)(batch(), current(), None, MetricSums())
    assert loss.item() == pytest.approx(-0.85 / 2, abs=1e-6)


def test_value_loss_hand_computed():
    # V = [0.5, 1.0], V_old = [0.0, 0.0], R = [1.0, 0.0], clip 0.2:
    # token 1: max((0.5-1)^2, (0.2-1)^2) / 2 = 0.32 (clipped term larger); token 2: max(1, 0.04) / 2 = 0.5
    b = batch()
    b.values = torch.zeros(1, 3)
    b.returns = torch.tensor([[0.0, 1.0, 0.0]])
    values = torch.tensor([[0.0, 0.5, 1.0]], requires_grad=True)
    metrics = MetricSums()
    loss = ValueLoss(LossDenominator(tokens=2), clip=0.2)(b, values, metrics)
    assert loss.item() == pytest.approx((0.32 + 0.5) / 2)
    m = metrics.means()
    assert m["critic/value_clip_frac"] == 0.5 and m["critic/values"] == pytest.approx(0.75)
    loss.backward()
    # the clipped token's loss does not depend on V; the other's gradient is (V - R) / 2 tokens
    assert values.grad[0].tolist() == pytest.approx([0.0, 0.0, 0.5])


@pytest.mark.parametrize("variant", ["ppo", "vanilla", "tis", "topr", "cispo", "kimi15", "decoupled_ppo"])
def test_every_policy_loss_variant_dispatches(variant):
    b = batch()
    b.scores = torch.tensor([1.0])
    lp = current()
    metrics = MetricSums()
    spec = PolicyLossSpec(variant=variant, ratio_level="token",
                          knobs=PpoKnobs(dual_clip_c=3.0) if variant == "ppo" else None)
    loss = PolicyLoss(LossDenominator(tokens=2), spec)(b, lp, None, metrics)
    loss.backward()
    assert math.isfinite(loss.item()) and lp.grad is not None and lp.grad[0, 1:].abs().sum() > 0
    assert {"pg_loss", "clip_frac", "ratio_mean", "approx_kl"} <= set(metrics.means())


def test_gspo_sequence_ratio_in_the_step_loss():
    # log-ratios ln1.5 and ln0.5 -> s = exp((ln1.5 + ln0.5) / 2) = sqrt(0.75) = 0.8660, inside [0.8, 1.2]:
    # token-mean of -s * A = -0.8660; each token's gradient is -s * A / 2 tokens.
    b = batch()
    lp = current()
    spec = PolicyLossSpec(ratio_level="sequence")
    loss = PolicyLoss(LossDenominator(tokens=2), spec)(b, lp, None, MetricSums())
    assert loss.item() == pytest.approx(-math.sqrt(0.75), abs=1e-6)
    loss.backward()
    assert lp.grad[0, 1:].tolist() == pytest.approx([-math.sqrt(0.75) / 2] * 2, abs=1e-6)


def _fill_prompt(b: TrainBatch, fill: float) -> TrainBatch:
    """The batch with every per-token field's off-mask entry (the prompt position) set to ``fill``."""
    for name in ("advantages", "rollout_logprobs", "old_logprobs", "ref_logprobs", "token_weights", "values",
                 "returns"):
        value = getattr(b, name).clone()
        value[0, 0] = fill
        setattr(b, name, value)
    return b


@pytest.mark.parametrize("variant", POLICY_LOSSES.names)
def test_nan_padding_reaches_neither_the_step_loss_nor_its_gradient(variant):
    # Padding may hold NaN (a sampler's missing log-prob) or -inf (a reference log-prob of a masked token);
    # every input is selected on the mask, so the loss and the gradient equal those of a clean batch.
    spec = PolicyLossSpec(variant=variant, kl=KLSpec(loss_coef=0.1), entropy_coef=0.01)
    results = []
    for fill in (0.0, math.nan, -math.inf, math.inf):
        b = batch()
        b.scores, b.ref_logprobs = torch.tensor([0.0]), torch.tensor([[0.0, -0.7, -2.5]])
        b.token_weights, b.values, b.returns = torch.ones(1, 3), torch.zeros(1, 3), torch.tensor([[0.0, 1.0, 0.5]])
        b = _fill_prompt(b, fill)
        lp = current().detach()
        lp[0, 0] = fill
        lp.requires_grad_(True)
        entropy = torch.tensor([[fill, 2.0, 1.0]], requires_grad=True)
        values = torch.tensor([[fill, 0.5, 1.0]], requires_grad=True)
        loss = PolicyLoss(LossDenominator(tokens=2), spec)(b, lp, entropy, MetricSums())
        loss = loss + ValueLoss(LossDenominator(tokens=2), clip=0.2)(b, values, MetricSums())
        loss = loss + SFTLoss(LossDenominator(tokens=2))(b, lp, None, MetricSums())
        loss.backward()
        grads = torch.cat([lp.grad, entropy.grad, values.grad])
        assert math.isfinite(loss.item()) and torch.isfinite(grads).all() and (grads[:, 0] == 0).all(), fill
        results.append((loss.item(), grads))
    for loss, grads in results[1:]:
        assert loss == pytest.approx(results[0][0], abs=1e-6) and torch.allclose(grads, results[0][1], atol=1e-6)
