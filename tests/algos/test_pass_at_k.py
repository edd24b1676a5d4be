import pytest

from gyre.algos.pass_at_k import default_ks, mean_at_k, mean_pass_at_k, pass_at_k


def test_pass_at_k_by_hand():
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # k=1 is the fraction correct: 1 - C(3,1)/C(4,1) = 1/4
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    # n=10, c=3, k=5: 1 - C(7,5)/C(10,5) = 1 - 21/252
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)
    # fewer wrong samples than k: every draw holds a correct one; none correct: never
    assert pass_at_k(4, 2, 3) == 1.0 and pass_at_k(4, 0, 4) == 0.0 and pass_at_k(3, 3, 1) == 1.0


def test_pass_at_k_rejects_impossible_counts():
    for n, c, k in ((4, 5, 1), (4, 1, 0), (4, 1, 5), (3, -1, 1)):
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_means_over_prompts():
    correct = [[True, False, False, False], [True, True, False, False]]
    # pass@2 per prompt: 1 - C(3,2)/C(4,2) = 1/2 and 1 - C(2,2)/C(4,2) = 5/6
    assert mean_pass_at_k(correct, 2) == pytest.approx((0.5 + 5 / 6) / 2)
    assert mean_pass_at_k(correct, 1) == pytest.approx((0.25 + 0.5) / 2)
    # every prompt weighs the same, whatever its sample count
    assert mean_at_k([[1.0, 0.0], [0.5, 0.5, 0.5, 0.5]]) == pytest.approx((0.5 + 0.5) / 2)
    assert default_ks(8) == [1, 2, 4, 8] and default_ks(6) == [1, 2, 4, 6] and default_ks(1) == [1]
