"""The simulated engines' KV budget is the one the run's engine sets (scenario.kv_budget), by hand."""

import pytest

from gyre.config import load_config
from gyre.sim.run import SimRun
from gyre.sim.scenario import kv_budget, scenario

CONFIG = "examples/math_boxed.yaml"
BASE = ["simulate.model=7b", "simulate.device=h100", "simulate.steps=2", "simulate.warmup_steps=1"]
PER_TOKEN = 2 * 28 * 4 * 128 * 2  # 7B: K and V, 28 layers, 4 KV heads of 128, bf16: 57,344 bytes


def budget(*overrides):
    spec = scenario(load_config(CONFIG, [*BASE, *overrides]), 8)
    return spec, kv_budget(load_config(CONFIG, [*BASE, *overrides]), spec.cost)


def test_vllm_pages_its_share_of_the_device_less_the_weights():
    # 0.9 x 80 GB - 15.2 GB of weights = 56.8 GB: 990,513 tokens of 57,344 bytes
    spec, tokens = budget("rollout.backend=vllm")
    assert tokens == pytest.approx((0.9 * 80e9 - 15.2e9) / PER_TOKEN)
    assert round(tokens) == 990_513
    assert SimRun(spec).new_engine().kv_tokens == tokens
    assert spec.max_rows == 256  # vLLM's max_num_seqs where rollout.max_batch_size is unset
    _, half = budget("rollout.backend=vllm", "rollout.gpu_memory_utilization=0.5")
    assert half == pytest.approx((40e9 - 15.2e9) / PER_TOKEN)


def test_the_hf_engine_takes_max_batch_tokens_and_its_memory_share_whichever_is_smaller():
    # 0.5 x 80 GB - 15.2 GB = 24.8 GB: 432,478 tokens; max_batch_tokens 100,000 is smaller
    _, share = budget("rollout.gpu_memory_utilization=0.5")
    assert round(share) == 432_478
    spec, both = budget("rollout.gpu_memory_utilization=0.5", "rollout.max_batch_tokens=100000")
    assert both == 100_000 and SimRun(spec).new_engine().kv_tokens == 100_000
    # neither: the engine sets no budget; the simulated one holds what the device holds beside the weights
    spec, none = budget()
    assert none is None and SimRun(spec).new_engine().kv_tokens == spec.cost.kv_capacity_tokens()


def test_a_share_too_small_for_the_weights_is_refused_with_the_numbers():
    with pytest.raises(ValueError, match=r"15 GB of weights\) does not fit in 10% of 1 x h100"):
        budget("rollout.backend=vllm", "rollout.gpu_memory_utilization=0.1")


def test_vllms_default_row_cap_is_the_engines_and_not_the_schedulers():
    # a run's scheduler is told rollout.max_batch_size (None here), whatever vLLM's own max_num_seqs is
    from gyre.rollout.schedule import sampling_params, schedule_spec

    cfg = load_config(CONFIG, [*BASE, "rollout.backend=vllm", "rollout.async_ratio=1"])
    spec = scenario(cfg, 8)
    assert spec.max_rows == 256 and spec.schedule.engine_slots is None
    assert schedule_spec(cfg, sampling_params(cfg)).engine_slots is None
