import pytest
import torch

from gyre.algos import group_normalized_advantages


def test_grpo_worked_example_sample_std():
    # g1 = [1, 0, 0, 1]: mean 0.5, sample std sqrt(4 * 0.25 / 3) = 0.57735 -> +-0.5 / 0.57735 = +-0.8660
    # g2 = [1, 1, 1, 0]: mean 0.75, sample std sqrt((3 * 0.0625 + 0.5625) / 3) = 0.5 -> 0.25/0.5, -0.75/0.5
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    adv = group_normalized_advantages(rewards, eps=1e-6, ddof=1)
    expected = torch.tensor([[0.8660, -0.8660, -0.8660, 0.8660], [0.5, 0.5, 0.5, -1.5]])
    assert torch.allclose(adv, expected, atol=1e-4)


def test_grpo_worked_example_population_std():
    # g1 population std = 0.5 -> +-1.0; g2 population std = sqrt(0.1875) = 0.4330 -> 0.5774 / -1.7321
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    adv = group_normalized_advantages(rewards, eps=1e-6, ddof=0)
    expected = torch.tensor([[1.0, -1.0, -1.0, 1.0], [0.5774, 0.5774, 0.5774, -1.7321]])
    assert torch.allclose(adv, expected, atol=1e-4)


def test_uniform_group_gets_zero_advantage_not_nan():
    adv = group_normalized_advantages(torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert torch.equal(adv, torch.zeros(2, 3))


def test_rows_sum_to_zero():
    rewards = torch.rand(16, 8, generator=torch.Generator().manual_seed(0))
    adv = group_normalized_advantages(rewards)
    assert torch.allclose(adv.sum(dim=1), torch.zeros(16), atol=1e-5)


def test_rejects_single_sample_groups():
    with pytest.raises(ValueError, match="G>=2"):
        group_normalized_advantages(torch.tensor([[1.0], [0.0]]))
