import math

import pytest
import torch

from gyre.algos.asyppo import aggregate_values, critic_rows, disagreement_masks, extreme_tokens, rank_count

# The reference's worked example (section 3.2): sigma over 10 valid tokens, k = h = 20%.
SIGMA = [0.01, 0.30, 0.05, 0.20, 0.02, 0.50, 0.10, 0.40, 0.15, 0.25]


def test_worked_example_masks_by_hand():
    sigma = torch.tensor([SIGMA])
    out = disagreement_masks(sigma, torch.ones(1, 10), 0.2, 0.2)
    # ceil(0.2 * 10) = 2 tokens each. I^A = 0 at tokens 1 and 5 (sigma 0.01, 0.02); I^H = 0 at 6 and 8 (0.50, 0.40).
    assert out.advantage.tolist() == [[0, 1, 1, 1, 0, 1, 1, 1, 1, 1]]
    assert out.entropy.tolist() == [[1, 1, 1, 1, 1, 0, 1, 0, 1, 1]]


def test_worked_example_in_a_padded_batch_with_nan_padding():
    # The same 10 tokens spread over two rows of width 7, padding holding NaN (and a tiny value that would
    # otherwise win the lowest rank): the masks pick the same tokens and never a padding position.
    sigma = torch.full((2, 7), float("nan"))
    mask = torch.zeros(2, 7)
    sigma[0, 1:6], mask[0, 1:6] = torch.tensor(SIGMA[:5]), 1
    sigma[1, :5], mask[1, :5] = torch.tensor(SIGMA[5:]), 1
    sigma[1, 6] = -1.0  # padding
    out = disagreement_masks(sigma, mask, 0.2, 0.2)
    masked_adv = (1 - out.advantage).nonzero().tolist()
    filtered = (1 - out.entropy).nonzero().tolist()
    assert masked_adv == [[0, 1], [0, 5]]  # sigma 0.01 and 0.02
    assert filtered == [[1, 0], [1, 2]]  # sigma 0.50 and 0.40
    assert not torch.isnan(out.advantage).any() and not torch.isnan(out.entropy).any()


def test_ties_are_broken_by_position():
    sigma = torch.tensor([[0.3, 0.1, 0.1, 0.3, 0.1, 0.3]])
    low = extreme_tokens(sigma, torch.ones(1, 6), 0.3, highest=False)  # ceil(1.8) = 2 of the three 0.1s
    high = extreme_tokens(sigma, torch.ones(1, 6), 0.3, highest=True)  # 2 of the three 0.3s
    assert low.tolist() == [[0, 1, 1, 0, 0, 0]]
    assert high.tolist() == [[1, 0, 0, 1, 0, 0]]


def test_rank_count_is_ceil_without_float_noise():
    assert rank_count(0.7, 10) == 7  # 0.7 * 10 == 7.000000000000001 in binary
    assert rank_count(0.2, 10) == 2 and rank_count(0.2, 11) == 3 and rank_count(0.2, 1) == 1
    assert rank_count(0.0, 10) == 0 and rank_count(1.0, 10) == 10 and rank_count(0.5, 0) == 0
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        rank_count(1.5, 4)


@pytest.mark.parametrize("seed", range(5))
def test_mask_counts_and_padding_properties(seed):
    g = torch.Generator().manual_seed(seed)
    sigma = torch.rand(6, 9, generator=g).round(decimals=1)  # many ties
    mask = (torch.rand(6, 9, generator=g) > 0.3).float()
    sigma[mask == 0] = float("nan")
    k, h = 0.25, 0.15
    n = int(mask.sum())
    out = disagreement_masks(sigma, mask, k, h)
    assert int((1 - out.advantage).sum()) == math.ceil(k * n)
    assert int((1 - out.entropy).sum()) == math.ceil(h * n)
    assert ((1 - out.advantage) * (1 - mask)).sum() == 0 and ((1 - out.entropy) * (1 - mask)).sum() == 0
    valid = sigma[mask.bool()]
    # Every masked token's sigma is <= every kept one's (the lowest k%), and the reverse for the filter.
    assert sigma[(out.advantage == 0)].max() <= valid[(out.advantage == 1)[mask.bool()]].min()
    assert sigma[(out.entropy == 0)].min() >= valid[(out.entropy == 1)[mask.bool()]].max()


def test_aggregate_values_mean_min_and_population_std():
    values = torch.tensor([[[1.0, 2.0]], [[3.0, 2.0]]])  # M = 2, B = 1, T = 2
    mean, sigma = aggregate_values(values)
    assert mean.tolist() == [[2.0, 2.0]] and sigma.tolist() == [[1.0, 0.0]]  # std of {1, 3} with ddof 0 is 1
    low, _ = aggregate_values(values, "min")
    assert low.tolist() == [[1.0, 2.0]]
    one, zero = aggregate_values(values[:1])
    assert torch.equal(one, values[0]) and zero.abs().sum() == 0


def test_group_response_split_deals_each_groups_responses_evenly():
    # Two groups of 4 responses, then 2 padding rows.
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, -1, -1])
    rows = critic_rows(groups, 2)
    assert [r.tolist() for r in rows] == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]
    for r in rows:  # every critic sees every prompt, half its responses
        assert sorted(set(groups[r].tolist()) - {-1}) == [0, 1]


def test_prompt_shard_gives_whole_groups():
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    rows = critic_rows(groups, 2, "prompt_shard")
    assert [r.tolist() for r in rows] == [[0, 1, 4, 5], [2, 3, 6, 7]]


@pytest.mark.parametrize("division", ["group_response_split", "prompt_shard"])
@pytest.mark.parametrize("m", [1, 2, 3])
def test_critic_rows_are_a_disjoint_cover(division, m):
    groups = torch.arange(6).repeat_interleave(6)
    rows = critic_rows(groups, m, division)
    every = torch.cat(rows).sort().values
    assert torch.equal(every, torch.arange(36)) and len(rows) == m
    assert {len(r) for r in rows} == {36 // m}
