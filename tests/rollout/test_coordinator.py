from gyre.rollout.coordinator import assign_requests
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


def test_workers_stream_parts_to_the_driver_as_they_finish(ray_local, tiny_model_dir):
    """Two rollout actors stream finished samples back; the callback sees every part before the end."""
    from gyre.cluster.group import RoleGroup
    from gyre.cluster.workers import RolloutWorker
    from gyre.rollout.coordinator import RolloutCoordinator

    cls = ray_local.remote(RolloutWorker).options(num_cpus=0.5)
    actors = [cls.remote(r, str(tiny_model_dir), str(tiny_model_dir), "float32", False, "cpu", 1, None)
              for r in range(2)]
    coordinator = RolloutCoordinator(RoleGroup("rollout", actors, (0, 1)))
    params = SamplingParams(temperature=1.0, max_new_tokens=12, stop=tuple("aeiou0123"))
    requests = [GenerationRequest(f"r{i}", [3 + i, 7], params, n=6, seed=i) for i in range(4)]
    parts = []
    results = coordinator.generate(requests, on_results=parts.append)
    assert len(parts) > 2  # several parts per worker, not one answer per worker
    assert sorted((r.request_id, r.sample_index) for p in parts for r in p) == \
        [(r.request_id, r.sample_index) for r in results]
    for actor in actors:
        ray_local.kill(actor)
