import pytest
import torch

from gyre.algos.advantages import (
    discounted_returns,
    gae_advantages,
    group_centred_batch_std_advantages,
    group_normalized_advantages,
    normalize_rewards,
    outcome_token_rewards,
    rloo_advantages,
)
from gyre.algos.kl import kl_penalized_rewards
from gyre.algos.stats import RunningMoments

# Reference §1.2 fixture: g1 = [1, 0, 0, 1] (mean 0.5), g2 = [1, 1, 1, 0] (mean 0.75).
# Batch mean 0.625; batch squared deviations 5 * 0.375^2 + 3 * 0.625^2 = 0.703125 + 1.171875 = 1.875
# -> batch std ddof 1 sqrt(1.875 / 7) = 0.51755, ddof 0 sqrt(1.875 / 8) = 0.48412.
R = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])


def _t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_grpo_worked_example_sample_std():
    # g1: sample std sqrt(4 * 0.25 / 3) = 0.57735 -> +-0.5 / 0.57735 = +-0.8660
    # g2: sample std sqrt((3 * 0.0625 + 0.5625) / 3) = 0.5 -> 0.25 / 0.5, -0.75 / 0.5
    expected = _t([[0.8660, -0.8660, -0.8660, 0.8660], [0.5, 0.5, 0.5, -1.5]])
    assert torch.allclose(group_normalized_advantages(R, eps=1e-6, ddof=1), expected, atol=1e-4)
    assert torch.allclose(normalize_rewards(R, "group", "group", ddof=1), expected, atol=1e-4)


def test_grpo_worked_example_population_std():
    # g1 population std 0.5 -> +-1.0; g2 population std sqrt(0.1875) = 0.43301 -> 0.5774 / -1.7321
    expected = _t([[1.0, -1.0, -1.0, 1.0], [0.5774, 0.5774, 0.5774, -1.7321]])
    assert torch.allclose(group_normalized_advantages(R, eps=1e-6, ddof=0), expected, atol=1e-4)
    assert torch.allclose(normalize_rewards(R, "group", "group", ddof=0), expected, atol=1e-4)


def test_dr_grpo_group_mean_no_std():
    # r - group mean, no division (S = 1, eps = 0): exact.
    expected = _t([[0.5, -0.5, -0.5, 0.5], [0.25, 0.25, 0.25, -0.75]])
    assert torch.equal(normalize_rewards(R, "group", "none"), expected)


def test_batch_batch_scopes():
    # ROLL's "reinforce++" configuration (the outcome over responses, not the paper's token-level returns).
    # (1 - 0.625) / 0.51755 = 0.7246; (0 - 0.625) / 0.51755 = -1.2076
    a, b = 0.7246, -1.2076
    expected = _t([[a, b, b, a], [a, a, a, b]])
    assert torch.allclose(normalize_rewards(R, "batch", "batch", ddof=1), expected, atol=1e-4)
    # ddof 0: 0.375 / 0.48412 = 0.7746; -0.625 / 0.48412 = -1.2910
    a, b = 0.7746, -1.2910
    assert torch.allclose(normalize_rewards(R, "batch", "batch", ddof=0), _t([[a, b, b, a], [a, a, a, b]]), atol=1e-4)


def test_lite_ppo_group_mean_batch_std():
    # +-0.5 / 0.51755 = +-0.9661; 0.25 / 0.51755 = 0.4830; -0.75 / 0.51755 = -1.4491
    expected = _t([[0.9661, -0.9661, -0.9661, 0.9661], [0.4830, 0.4830, 0.4830, -1.4491]])
    assert torch.allclose(normalize_rewards(R, "group", "batch"), expected, atol=1e-4)


def test_rloo_worked_example():
    # g1, r = 1: others [0, 0, 1] mean 1/3 -> 2/3; r = 0: others [1, 0, 1] mean 2/3 -> -2/3.
    # g2, r = 1: others [1, 1, 0] mean 2/3 -> 1/3; r = 0: others [1, 1, 1] -> -1.
    expected = _t([[2 / 3, -2 / 3, -2 / 3, 2 / 3], [1 / 3, 1 / 3, 1 / 3, -1.0]])
    assert torch.allclose(rloo_advantages(R), expected, atol=1e-6)
    # RLOO = G / (G - 1) * Dr.GRPO
    assert torch.allclose(rloo_advantages(R), 4 / 3 * normalize_rewards(R, "group", "none"), atol=1e-6)


def test_group_centred_batch_std_worked_example():
    # REINFORCE++-baseline with its batch std over responses:
    # c = [+-0.5 ...], [0.25, 0.25, 0.25, -0.75]; mean(c) = 0, sum c^2 = 1 + 0.1875 + 0.5625 = 1.75
    # -> std ddof 1 sqrt(1.75 / 7) = 0.5 -> A = c / 0.5
    expected = _t([[1.0, -1.0, -1.0, 1.0], [0.5, 0.5, 0.5, -1.5]])
    assert torch.allclose(group_centred_batch_std_advantages(R), expected, atol=1e-5)


def test_running_scope_with_only_this_batch_equals_batch_scope():
    running = RunningMoments()
    running.update(R)  # the caller updates before normalising
    got = normalize_rewards(R, "running", "running", running=running)
    assert torch.allclose(got, normalize_rewards(R, "batch", "batch"), atol=1e-6)


def test_running_scope_hand_computed():
    # History [0, 2] then this batch [1, 3]: all = [0, 2, 1, 3], mean 1.5,
    # sample var (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3 -> std 1.29099 -> A = [-0.5, 1.5] / 1.29099
    running = RunningMoments()
    running.update(torch.tensor([0.0, 2.0]))
    rewards = torch.tensor([[1.0, 3.0]])
    running.update(rewards)
    got = normalize_rewards(rewards, "running", "running", running=running)
    assert torch.allclose(got, torch.tensor([[-0.38730, 1.16190]]), atol=1e-4)
    # Mixed scopes: running mean 1.5, no std -> [-0.5, 1.5]
    assert torch.allclose(normalize_rewards(rewards, "running", "none", running=running), torch.tensor([[-0.5, 1.5]]))


def test_normalize_rewards_errors_and_edge_cases():
    with pytest.raises(ValueError, match="RunningMoments"):
        normalize_rewards(R, "running", "none")
    with pytest.raises(ValueError, match="G>=2"):
        normalize_rewards(torch.tensor([[1.0], [0.0]]), "group", "none")
    with pytest.raises(ValueError, match="G>=2"):
        normalize_rewards(torch.tensor([[1.0], [0.0]]), "batch", "group")
    with pytest.raises(ValueError, match="mean scope"):
        normalize_rewards(R, "token", "none")  # type: ignore[arg-type]
    # A single reward with a ddof-1 batch std: the std is treated as 0 -> (2 - 2) / (0 + eps) = 0, not NaN.
    single = normalize_rewards(torch.tensor([[2.0]]), "batch", "batch")
    assert torch.equal(single, torch.zeros(1, 1))
    # G = 1 is fine for batch scopes: [[1], [3]] mean 2, sample std sqrt(2) -> -+0.70711
    got = normalize_rewards(torch.tensor([[1.0], [3.0]]), "batch", "batch")
    assert torch.allclose(got, torch.tensor([[-0.70711], [0.70711]]), atol=1e-5)


def test_uniform_group_gets_zero_advantage_not_nan():
    adv = group_normalized_advantages(torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert torch.equal(adv, torch.zeros(2, 3))


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_group_centred_estimators_sum_to_zero_per_group(seed):
    rewards = torch.rand(16, 8, generator=torch.Generator().manual_seed(seed))
    for adv in (group_normalized_advantages(rewards), normalize_rewards(rewards, "group", "group"),
                normalize_rewards(rewards, "group", "none"), normalize_rewards(rewards, "group", "batch"),
                rloo_advantages(rewards), group_centred_batch_std_advantages(rewards)):
        assert torch.allclose(adv.sum(dim=1), torch.zeros(16), atol=1e-5)


def test_rejects_single_sample_groups():
    with pytest.raises(ValueError, match="G>=2"):
        group_normalized_advantages(torch.tensor([[1.0], [0.0]]))
    with pytest.raises(ValueError, match="G>=2"):
        rloo_advantages(torch.tensor([[1.0], [0.0]]))
    with pytest.raises(ValueError, match="G>=2"):
        group_centred_batch_std_advantages(torch.tensor([[1.0], [0.0]]))


def test_outcome_token_rewards_on_last_valid_token():
    # Row 0: last valid at t = 1; row 1: a hole at t = 2, last valid at t = 3; row 2: empty mask, nothing.
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 0, 1], [0, 0, 0, 0]])
    out = outcome_token_rewards(torch.tensor([1.0, 2.0, 3.0]), mask)
    assert torch.equal(out, torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 2.0], [0.0, 0.0, 0.0, 0.0]]))


def test_discounted_returns_worked_example():
    # r = [0, 0, 1]: gamma 1 -> [1, 1, 1]; gamma 0.9 -> [0.9^2, 0.9, 1] = [0.81, 0.9, 1]
    r = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    mask = torch.ones(1, 3)
    assert torch.allclose(discounted_returns(r, mask, 1.0), torch.tensor([[1.0, 1.0, 1.0]], dtype=torch.float64))
    assert torch.allclose(discounted_returns(r, mask, 0.9), torch.tensor([[0.81, 0.9, 1.0]], dtype=torch.float64))


def test_returns_with_kl_penalty_worked_example():
    # beta 0.1, k1 = logp - logp_ref = [0.2, -0.1, 0.3] -> r' = [0, 0, 1] - 0.1 * k1 = [-0.02, 0.01, 0.97]
    # G (gamma 1) = [-0.02 + 0.01 + 0.97, 0.01 + 0.97, 0.97] = [0.96, 0.98, 0.97]
    r = outcome_token_rewards(torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 3))
    logp = torch.tensor([[0.2, -0.1, 0.3]], dtype=torch.float64)
    penalised, kl = kl_penalized_rewards(r, logp, torch.zeros_like(logp), torch.ones(1, 3), coef=0.1, kind="k1")
    assert torch.allclose(penalised, torch.tensor([[-0.02, 0.01, 0.97]], dtype=torch.float64))
    g = discounted_returns(penalised, torch.ones(1, 3), gamma=1.0)
    assert torch.allclose(g, torch.tensor([[0.96, 0.98, 0.97]], dtype=torch.float64))


def test_returns_skip_masked_positions():
    # Same rewards as the worked example, with a masked env token (reward 5, ignored) and trailing padding:
    # valid tokens keep [0.81, 0.9, 1.0]; masked positions are 0.
    r = torch.tensor([[0.0, 5.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 0, 1, 1, 0]])
    expected = torch.tensor([[0.81, 0.0, 0.9, 1.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(discounted_returns(r, mask, 0.9), expected)


def test_gae_worked_example():
    # V = [0.5, 0.6, 0.7], terminal after the last token, gamma 1, lam 0.95:
    # delta = [0 + 0.6 - 0.5, 0 + 0.7 - 0.6, 1 + 0 - 0.7] = [0.1, 0.1, 0.3]
    # A_2 = 0.3; A_1 = 0.1 + 0.95 * 0.3 = 0.385; A_0 = 0.1 + 0.95 * 0.385 = 0.46575; R = A + V
    r = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    v = torch.tensor([[0.5, 0.6, 0.7]], dtype=torch.float64)
    adv, ret = gae_advantages(r, v, torch.ones(1, 3), gamma=1.0, lam=0.95)
    assert torch.allclose(adv, torch.tensor([[0.46575, 0.385, 0.3]], dtype=torch.float64))
    assert torch.allclose(ret, torch.tensor([[0.96575, 0.985, 1.0]], dtype=torch.float64))


def test_gae_lambda_one_is_monte_carlo():
    # lam = 1 telescopes: A_t = G_t - V_t.
    g = torch.Generator().manual_seed(0)
    r = torch.randn(4, 6, dtype=torch.float64, generator=g)
    v = torch.randn(4, 6, dtype=torch.float64, generator=g)
    mask = torch.ones(4, 6)
    adv, _ = gae_advantages(r, v, mask, gamma=0.9, lam=1.0)
    assert torch.allclose(adv, discounted_returns(r, mask, 0.9) - v)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_holes_leave_returns_and_gae_of_valid_tokens_unchanged(seed):
    g = torch.Generator().manual_seed(seed)
    b, t = 5, 8
    r = torch.randn(b, t, dtype=torch.float64, generator=g)
    v = torch.randn(b, t, dtype=torch.float64, generator=g)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = (torch.arange(t).expand(b, t) < lengths[:, None]).long()
    # Insert 2 masked columns (env tokens with garbage rewards and values) after column 2.
    holes = torch.randn(b, 2, dtype=torch.float64, generator=g) * 100

    def with_holes(x, fill):
        return torch.cat([x[:, :3], fill, x[:, 3:]], dim=1)

    r_h, v_h = with_holes(r, holes), with_holes(v, holes)
    mask_h = with_holes(mask, torch.zeros(b, 2, dtype=torch.long))
    keep = torch.ones(t + 2, dtype=torch.bool)
    keep[3:5] = False

    ret, ret_h = discounted_returns(r, mask, 0.9), discounted_returns(r_h, mask_h, 0.9)
    assert torch.allclose(ret_h[:, keep], ret) and (ret_h[:, ~keep] == 0).all()
    (adv, gret), (adv_h, gret_h) = gae_advantages(r, v, mask, 0.9, 0.95), gae_advantages(r_h, v_h, mask_h, 0.9, 0.95)
    assert torch.allclose(adv_h[:, keep], adv) and torch.allclose(gret_h[:, keep], gret)
    assert (adv_h[:, ~keep] == 0).all() and (gret_h[:, ~keep] == 0).all()
