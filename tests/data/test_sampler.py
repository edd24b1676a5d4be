import pytest

from gyre.data.sampler import EpochSampler


def test_each_epoch_is_a_permutation():
    s = EpochSampler(10, seed=3)
    first, second = s.take(10), s.take(10)
    assert sorted(first) == list(range(10)) and sorted(second) == list(range(10))
    assert first != second  # a new order per epoch


def test_resume_continues_the_same_stream():
    a = EpochSampler(7, seed=1)
    a.take(5)
    state = a.state_dict()
    expected = a.take(12)
    b = EpochSampler(7, seed=1)
    b.load_state_dict(state)
    assert b.take(12) == expected


def test_state_from_other_data_is_rejected():
    with pytest.raises(ValueError, match="the data or seed changed"):
        EpochSampler(8, seed=1).load_state_dict(EpochSampler(7, seed=1).state_dict())
