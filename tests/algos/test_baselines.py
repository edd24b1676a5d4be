"""Baselines that read more than the rewards (ReMax, OPO, pass@k, GPG), against arithmetic written out here."""

import itertools
import math

import pytest
import torch

from gyre.algos.advantages import gpg_advantages
from gyre.algos.baselines import (
    BaselineContext,
    gpg_alpha,
    opo_advantages,
    pass_at_k_advantages,
    remax_advantages,
)

F64 = torch.float64


def test_remax_subtracts_the_greedy_reward():
    # Two prompts, two samples each; greedy responses scored 0.5 and 1.0 (Li et al., Algorithm 1).
    rewards = torch.tensor([[1.0, 0.0], [0.25, 1.0]])
    assert remax_advantages(rewards, torch.tensor([0.5, 1.0])).tolist() == [[0.5, -0.5], [-0.75, 0.0]]
    # One sample per prompt (the paper's setting) works: no group statistics.
    assert remax_advantages(torch.tensor([[0.2]]), torch.tensor([0.7])).tolist() == [[pytest.approx(-0.5)]]
    with pytest.raises(ValueError, match="greedy rewards \\[N\\]"):
        remax_advantages(rewards, torch.tensor([0.5]))


def test_opo_uses_the_length_weighted_group_mean():
    # Rewards [1, 0, 1] with lengths [2, 4, 6]: b = (2*1 + 4*0 + 6*1) / 12 = 2/3, A = r - 2/3.
    adv = opo_advantages(torch.tensor([[1.0, 0.0, 1.0]], dtype=F64), torch.tensor([[2, 4, 6]]))
    assert adv[0].tolist() == pytest.approx([1 / 3, -2 / 3, 1 / 3])
    # Equal lengths: the plain group mean (Dr.GRPO's advantage); the weighted mean of A is 0.
    assert opo_advantages(torch.tensor([[1.0, 0.0]]), torch.tensor([[3, 3]])).tolist() == [[0.5, -0.5]]
    lengths = torch.tensor([[2.0, 4.0, 6.0]], dtype=F64)
    assert float((adv * lengths).sum()) == pytest.approx(0.0, abs=1e-12)
    # Only empty responses: the plain mean, not 0/0.
    assert opo_advantages(torch.tensor([[1.0, 0.0]]), torch.tensor([[0, 0]])).tolist() == [[0.5, -0.5]]


def test_pass_at_k_binary_matches_chen_et_al():
    # G = 4, one correct, k = 2 (Chen et al.'s analytical form):
    #   R = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5, s = sqrt(0.5 * 0.5) = 0.5
    #   A_pos = (1 - R) / s = 1;  A_neg = (1 - R - C(2,1)/C(3,1)) / s = (0.5 - 2/3) / 0.5 = -1/3
    adv = pass_at_k_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=F64), k=2, eps=0.0)
    assert adv[0].tolist() == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    # Two correct of four, k = 2: R = 1 - C(2,2)/C(4,2) = 5/6, s = sqrt(5/36) = 0.37268;
    #   A_pos = (1/6) / s = 0.44721; A_neg = (1/6 - C(1,1)/C(3,1)) / s = -0.44721.
    adv = pass_at_k_advantages(torch.tensor([[0.0, 1.0, 0.0, 1.0]], dtype=F64), k=2, eps=0.0)
    assert adv[0].tolist() == pytest.approx([-0.44721, 0.44721, -0.44721, 0.44721], abs=1e-5)


def test_pass_at_k_graded_rewards_use_the_best_of_k():
    # Rewards [0.5, 0.2, 0.9], k = 2: subsets {.5,.2} -> .5, {.5,.9} -> .9, {.2,.9} -> .9.
    #   mean of maxima R = 2.3/3 = 0.76667; E[max^2] = (.25 + .81 + .81)/3 = 0.62333; s = sqrt(0.62333 - R^2) = 0.18856
    #   subsets holding 0.5: (.5 + .9)/2 = 0.7; holding 0.2: (.5 + .9)/2 = 0.7; holding 0.9: 0.9
    #   A = (0.7 - R)/s = -0.35355, -0.35355, (0.9 - R)/s = 0.70711
    adv = pass_at_k_advantages(torch.tensor([[0.5, 0.2, 0.9]], dtype=F64), k=2, eps=0.0)
    assert adv[0].tolist() == pytest.approx([-0.35355, -0.35355, 0.70711], abs=1e-5)


def test_pass_at_k_against_enumerated_subsets():
    """Property: every advantage equals the enumeration over all k-subsets, rows sum to 0, and k = 1 is GRPO
    with the population std."""
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(5, 6, generator=gen, dtype=F64).round(decimals=1)  # ties included
    for k in (1, 2, 3):
        adv = pass_at_k_advantages(rewards, k, eps=0.0)
        for row, got in zip(rewards.tolist(), adv.tolist()):
            subsets = list(itertools.combinations(range(6), k))
            best = {s: max(row[i] for i in s) for s in subsets}
            mean = sum(best.values()) / len(best)
            spread = math.sqrt(sum(v * v for v in best.values()) / len(best) - mean ** 2)
            for i in range(6):
                holding = [best[s] for s in subsets if i in s]
                assert got[i] == pytest.approx((sum(holding) / len(holding) - mean) / spread, abs=1e-9)
        assert adv.sum(dim=1).abs().max() < 1e-9
    # k = G: every sample is in the one subset, so none raises its best-of-k: all 0.
    assert pass_at_k_advantages(rewards, 6).abs().max() < 1e-6
    grpo = (rewards - rewards.mean(1, keepdim=True)) / rewards.std(1, correction=0, keepdim=True)
    assert torch.allclose(pass_at_k_advantages(rewards, 1, eps=0.0), grpo)


def test_pass_at_k_checks_k():
    with pytest.raises(ValueError, match="1 <= k <= G"):
        pass_at_k_advantages(torch.zeros(1, 3), k=4)
    assert pass_at_k_advantages(torch.ones(1, 3), k=2).abs().max() == 0  # equal rewards: 0, not NaN


def test_gpg_scales_by_the_share_of_groups_with_a_signal():
    # Three groups of two: [1, 0] varies, [1, 1] and [0, 0] do not. B = 6, M = 4 -> alpha = 6 / 2 = 3.
    rewards = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    assert gpg_alpha(rewards) == 3.0
    # F_norm = 1 (the paper's best): alpha (r - mean) = 3 * [0.5, -0.5]
    assert gpg_advantages(rewards).tolist() == [[1.5, -1.5], [0.0, 0.0], [0.0, 0.0]]
    # F_norm = std: 3 * 0.5 / (0.70711 + 1e-6) = 2.12132
    assert gpg_advantages(rewards, "group", "group")[0].tolist() == pytest.approx([2.12132, -2.12132], abs=1e-5)
    assert gpg_alpha(torch.ones(2, 3)) == 1.0  # no signal anywhere: no scale (every advantage is 0 anyway)


def test_context_rows_select_groups():
    ctx = BaselineContext(torch.tensor([[1, 2], [3, 4], [5, 6]]), torch.tensor([0.1, 0.2, 0.3]))
    part = ctx.rows(torch.tensor([2, 0]))
    assert part.lengths.tolist() == [[5, 6], [1, 2]] and part.greedy.tolist() == pytest.approx([0.3, 0.1])
    assert BaselineContext().rows(torch.tensor([0])).greedy is None
