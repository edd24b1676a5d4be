"""Multi-turn credit assignment (reference algorithms.md section 4): hand-computed turn returns, ReBN, GiGPO
and IPA chunk returns."""

import pytest
import torch

from gyre.algos.advantages import discounted_returns, normalize_rewards
from gyre.algos.agentic import (
    anchor_ids,
    chunk_returns,
    gigpo_advantages,
    gigpo_step_advantages,
    grouped_normalize,
    rebn_advantages,
    turn_returns,
)

F64 = torch.float64


def _t(rows):
    return torch.tensor(rows, dtype=F64)


# GEM's guessing game (section 4.1): -0.05 per guess, +1 on success; episode 2 is truncated (a padded turn).
GEM_REWARDS = _t([[-0.05, -0.05, 1.0], [-0.05, -0.05, 0.0]])
GEM_MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_turn_returns_worked_example():
    # gamma 0.9: [-0.05 + 0.9 * 0.85, -0.05 + 0.9 * 1, 1] = [0.715, 0.85, 1.0]; [-0.05 + 0.9 * -0.05, -0.05].
    got = turn_returns(GEM_REWARDS, GEM_MASK, 0.9)
    assert torch.allclose(got, _t([[0.715, 0.85, 1.0], [-0.095, -0.05, 0.0]]), atol=1e-12)
    # gamma 0 keeps each turn's own reward; gamma 1 sums the rest of the episode.
    assert torch.allclose(turn_returns(GEM_REWARDS, GEM_MASK, 0.0), GEM_REWARDS)
    assert torch.allclose(turn_returns(GEM_REWARDS, GEM_MASK, 1.0), _t([[0.9, 0.95, 1.0], [-0.1, -0.05, 0.0]]))


def test_turn_returns_equal_the_token_recursion():
    # The same recursion as the token-level returns (G_t = r_t + gamma * G_{t+1}), computed as one product.
    g = torch.Generator().manual_seed(0)
    r = torch.randn(5, 6, dtype=F64, generator=g)
    mask = (torch.arange(6).expand(5, 6) < torch.tensor([[6], [1], [3], [0], [4]])).long()
    assert torch.allclose(turn_returns(r, mask, 0.8), discounted_returns(r, mask, 0.8))


def test_chunk_returns_ipa_example():
    # 4 chunks, gamma 0.9, R_final 1: [0.9^3, 0.9^2, 0.9, 1] = [0.729, 0.81, 0.9, 1.0]. A 2-chunk trajectory
    # with R = -2 (padded to 4): [-1.8, -2, 0, 0]; a trajectory without turns gets nothing.
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]])
    got = chunk_returns(_t([1.0, -2.0, 5.0]), mask, 0.9)
    assert torch.allclose(got, _t([[0.729, 0.81, 0.9, 1.0], [-1.8, -2.0, 0.0, 0.0], [0.0] * 4]), atol=1e-12)


def test_chunk_returns_equal_the_segment_recursion_when_only_the_end_is_rewarded():
    # ROLL agentic_reinforce: G_S = r_S, G_s = r_s + gamma * G_{s+1}; with r_s = 0 before the last segment
    # that is gamma^(S-s) * R, IPA's chunk return. With a reward in the middle they differ.
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    final = _t([1.0, -2.0])
    end_only = _t([[0.0, 0.0, 0.0, 1.0], [0.0, -2.0, 0.0, 0.0]])
    assert torch.allclose(chunk_returns(final, mask, 0.9), turn_returns(end_only, mask, 0.9))
    dense = end_only.clone()
    dense[0, 1] = 0.5
    assert not torch.allclose(chunk_returns(final, mask, 0.9), turn_returns(dense, mask, 0.9))


def test_rebn_worked_example():
    # Returns [0.715, 0.85, 1.0] and [-0.095, -0.05]: all 5 transitions have mean 2.42 / 5 = 0.484,
    # std 0.4635 (ddof 0, GEM's) or 0.5182 (ddof 1).
    pop = rebn_advantages(GEM_REWARDS, GEM_MASK, gamma=0.9, ddof=0)
    assert torch.allclose(pop, _t([[0.4984, 0.7897, 1.1134], [-1.2493, -1.1522, 0.0]]), atol=1e-4)
    sample = rebn_advantages(GEM_REWARDS, GEM_MASK, gamma=0.9, ddof=1)
    assert torch.allclose(sample, _t([[0.4458, 0.7063, 0.9958], [-1.1174, -1.0306, 0.0]]), atol=1e-4)
    assert sample[1, 2].item() == 0.0


def test_grouped_normalize_groups_of_any_size():
    # Group 7: [1, 3] -> mean 2, deviations -+1, std 1 (ddof 0) / 1.4142 (ddof 1). Group 2: [5] alone -> 0.
    # Group 4: [2, 2, 2] -> all 0 (no NaN from a zero std).
    values, ids = _t([1.0, 5.0, 3.0, 2.0, 2.0, 2.0]), torch.tensor([7, 2, 7, 4, 4, 4])
    assert grouped_normalize(values, ids, True, 0.0, 0).tolist() == [-1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    ddof1 = grouped_normalize(values, ids, True, 1e-6, 1)
    assert ddof1.tolist() == pytest.approx([-0.70711, 0.0, 0.70711, 0.0, 0.0, 0.0], abs=1e-5)
    assert grouped_normalize(values, ids, False).tolist() == [-1.0, 0.0, 1.0, 0.0, 0.0, 0.0]


# GiGPO (section 4.2): one group of 3 trajectories from start state s0 (id 0), episode returns R = [1, 0, 1].
# Trajectory 1 succeeds after 2 steps, trajectory 2 fails in 3 (revisiting s2), trajectory 3 succeeds after 3.
GIGPO_REWARDS = _t([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
GIGPO_MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1]])
GIGPO_STATES = torch.tensor([[0, 1, -1], [0, 2, 2], [0, 1, 3]])  # s0..s3; -1 is padding
ONE_GROUP = torch.tensor([0, 0, 0])


def test_gigpo_step_level_worked_example():
    # Returns with step_reward_gamma 0.95: [0.95, 1], [0, 0, 0], [0.9025, 0.95, 1].
    # Anchor s0: [0.95, 0, 0.9025], mean 0.6175, deviations [0.3325, -0.6175, 0.285], std 0.43707 (ddof 0)
    #   -> [0.7607, -1.4128, 0.6521]; ddof 1 (std 0.53530) -> [0.6211, -1.1536, 0.5324].
    # Anchor s1: [1, 0.95] -> mean 0.975, +-0.025, std 0.025 (ddof 0) -> +-1.
    # Anchor s2: [0, 0] -> 0; anchor s3: one turn -> 0.
    got = gigpo_step_advantages(GIGPO_REWARDS, GIGPO_MASK, ONE_GROUP, GIGPO_STATES, 0.95, True, 1e-6, 0)
    assert torch.allclose(got, _t([[0.7607, 1.0, 0.0], [-1.4128, 0.0, 0.0], [0.6521, -1.0, 0.0]]), atol=1e-4)
    ddof1 = gigpo_step_advantages(GIGPO_REWARDS, GIGPO_MASK, ONE_GROUP, GIGPO_STATES, 0.95, True, 1e-6, 1)
    assert ddof1[:, 0].tolist() == pytest.approx([0.6211, -1.1536, 0.5324], abs=1e-4)
    # Std-free variant: the deviations themselves.
    free = gigpo_step_advantages(GIGPO_REWARDS, GIGPO_MASK, ONE_GROUP, GIGPO_STATES, 0.95, False)
    assert torch.allclose(free, _t([[0.3325, 0.025, 0.0], [-0.6175, 0.0, 0.0], [0.285, -0.025, 0.0]]), atol=1e-12)


def test_gigpo_combined_worked_example():
    # A^E (ddof 0): R = [1, 0, 1], mean 2/3, std 0.4714 -> [0.7071, -1.4142, 0.7071], on every turn.
    episode = normalize_rewards(_t([[1.0, 0.0, 1.0]]), "group", "group", 1e-6, 0)[0]
    assert episode.tolist() == pytest.approx([0.7071, -1.4142, 0.7071], abs=1e-4)
    got = gigpo_advantages(episode, GIGPO_REWARDS, GIGPO_MASK, ONE_GROUP, GIGPO_STATES, ddof=0)
    # Step 0, unit weights: [0.7071 + 0.7607, -1.4142 - 1.4128, 0.7071 + 0.6521] = [1.4678, -2.8270, 1.3592].
    assert got[:, 0].tolist() == pytest.approx([1.4678, -2.8270, 1.3592], abs=1e-4)
    # Later steps: s1 anchors +-1 on top of A^E; s2 and s3 add nothing; padding stays 0.
    assert got[:, 1:].tolist() == [pytest.approx(row, abs=1e-4) for row in
                                   [[1.7071, 0.0], [-1.4142, -1.4142], [-0.2929, 0.7071]]]
    step = gigpo_step_advantages(GIGPO_REWARDS, GIGPO_MASK, ONE_GROUP, GIGPO_STATES, 0.95, True, 1e-6, 0)
    weighted = gigpo_advantages(episode, GIGPO_REWARDS, GIGPO_MASK, ONE_GROUP, GIGPO_STATES, 0.95, 0.5, 2.0, ddof=0)
    assert torch.allclose(weighted, (0.5 * episode[:, None] + 2.0 * step) * GIGPO_MASK)


def test_gigpo_anchors_never_span_trajectory_groups():
    # A second group also starts from s0 (same state id): its turns form an anchor of their own.
    # Its returns [1, 0] -> +-1 (ddof 0); the first group's numbers do not move.
    rewards = torch.cat([GIGPO_REWARDS, _t([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])])
    mask = torch.cat([GIGPO_MASK, torch.tensor([[1, 0, 0], [1, 0, 0]])])
    states = torch.cat([GIGPO_STATES, torch.tensor([[0, -1, -1], [0, -1, -1]])])
    groups = torch.tensor([0, 0, 0, 1, 1])
    anchors = anchor_ids(groups, states)
    assert anchors[0, 0] == anchors[1, 0] == anchors[2, 0] != anchors[3, 0] == anchors[4, 0]
    got = gigpo_step_advantages(rewards, mask, groups, states, 0.95, True, 1e-6, 0)
    alone = gigpo_step_advantages(GIGPO_REWARDS, GIGPO_MASK, ONE_GROUP, GIGPO_STATES, 0.95, True, 1e-6, 0)
    assert torch.allclose(got[:3], alone)
    assert got[3:, 0].tolist() == pytest.approx([1.0, -1.0], abs=1e-5)
