import pytest
import torch

from gyre.algos.masks import difficulty_mask, overlong_mask, soft_overlong_penalty


def test_overlong_mask_zeroes_truncated_samples_only():
    out = overlong_mask(torch.tensor([False, True, False, True]))
    assert out.dtype == torch.float32
    assert torch.equal(out, torch.tensor([1.0, 0.0, 1.0, 0.0]))


def test_difficulty_mask_dapo_dynamic_sampling():
    # Group means: 1.0 (all correct, dropped), 0.0 (all wrong, dropped), 0.5 (kept), 0.75 (kept).
    rewards = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    out = difficulty_mask(rewards)
    expected = torch.tensor([[0.0] * 4, [0.0] * 4, [1.0] * 4, [1.0] * 4])
    assert torch.equal(out, expected)


def test_difficulty_mask_thresholds_are_exclusive():
    # Means 0.25 (== low: dropped), 0.5 (kept), 0.75 (== high: dropped), 0.375 (kept).
    rewards = torch.tensor([[0.5, 0.0], [1.0, 0.0], [1.0, 0.5], [0.75, 0.0]])
    out = difficulty_mask(rewards, low=0.25, high=0.75)
    assert torch.equal(out[:, 0], torch.tensor([0.0, 1.0, 0.0, 1.0]))
    assert torch.equal(out[:, 0], out[:, 1])  # whole groups


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_difficulty_mask_zeroes_exactly_the_uniform_groups(seed):
    g = torch.Generator().manual_seed(seed)
    rewards = (torch.rand(32, 4, generator=g) > 0.5).float()
    rewards[:3] = 1.0
    rewards[3:6] = 0.0
    out = difficulty_mask(rewards)
    uniform = (rewards == rewards[:, :1]).all(dim=1)
    assert torch.equal(out, (~uniform).float().unsqueeze(1).expand(32, 4))


def test_soft_overlong_penalty_dapo_examples():
    # L_max 20480, L_cache 4096 -> soft band starts at 16384.
    lengths = torch.tensor([16000, 16384, 18000, 18432, 20480, 20481, 30000])
    out = soft_overlong_penalty(lengths, max_len=20480, cache_len=4096)
    expected = torch.tensor([
        0.0,                      # 16000 <= 16384
        0.0,                      # at the band start
        (16384 - 18000) / 4096,   # -1616 / 4096 = -0.39453
        -0.5,                     # -2048 / 4096
        -1.0,                     # -4096 / 4096 at L_max itself
        -1.0,                     # beyond L_max
        -1.0,
    ])
    assert torch.allclose(out, expected)
    assert out[2].item() == pytest.approx(-0.3945, abs=1e-4)


@pytest.mark.parametrize("max_len,cache_len", [(100, 0), (100, 101), (100, -5)])
def test_soft_overlong_penalty_validates(max_len, cache_len):
    with pytest.raises(ValueError, match="cache_len"):
        soft_overlong_penalty(torch.tensor([10]), max_len, cache_len)
