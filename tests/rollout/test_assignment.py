from gyre.rollout.assignment import assign_requests
from gyre.types import GenerationRequest, SamplingParams


def req(i, prompt_len, n, new_tokens=10):
    return GenerationRequest(f"r{i}", [1] * prompt_len, SamplingParams(max_new_tokens=new_tokens), n=n)


def test_every_request_goes_to_exactly_one_worker_in_order():
    requests = [req(i, 5, 4) for i in range(7)]
    plan = assign_requests(requests, 3)
    assert sorted(i for part in plan for i in part) == list(range(7))
    assert all(part == sorted(part) for part in plan)
    assert sorted(len(p) for p in plan) == [2, 2, 3]


def test_work_is_balanced_by_tokens_not_counts():
    # work = n x (prompt + new tokens): 8 x 20 = 160 vs 1 x 20 = 20 each
    requests = [req(0, 10, 8)] + [req(i, 10, 1) for i in range(1, 9)]
    plan = assign_requests(requests, 2)
    assert [0] in plan  # the big request alone on one worker; the 8 small ones (160) on the other
