"""Rollout on pools of their own device classes (simulate.rollout_pools): each engine costs and holds what its
class does, training runs on simulate.device, the price adds every pool's (RollArt's equal-cost pools)."""

from pathlib import Path

import pytest

from gyre.config import load_config
from gyre.sim.memory import spec_fit
from gyre.sim.run import SimRun, simulate
from gyre.sim.scenario import scenario

CONFIG = Path(__file__).parents[2] / "examples" / "math_boxed.yaml"
BASE = ["simulate.model=7b", "simulate.device=h800", "simulate.steps=2", "simulate.warmup_steps=1",
        "rollout.backend=vllm", "rollout.prompts_per_step=8", "simulate.workload.response_tokens=200"]
MIXED = "simulate.rollout_pools=[{device: h800, devices: 2}, {device: h20, devices: 6}]"
PER_TOKEN = 2 * 28 * 4 * 128 * 2  # 7B: K and V, 28 layers, 4 KV heads of 128, bf16: 57,344 bytes


def spec_of(*overrides, devices=4):
    return scenario(load_config(CONFIG, [*BASE, *overrides]), devices)


def test_each_engine_is_of_its_pools_class_and_training_of_the_simulated_device():
    spec = spec_of(MIXED)
    assert spec.layout.describe() == "2 h800 + 6 h20 rollout + 4 h800 train"
    assert (spec.layout.devices, spec.layout.rollout_devices, spec.layout.train_devices) == (12, 8, 4)
    run = SimRun(spec)
    assert [e.cost.device.name for e in run.cluster.engines] == ["h800"] * 2 + ["h20"] * 6
    # vLLM pages 0.9 of each class's memory less 15.2 GB of weights
    assert run.cluster.engines[0].kv_tokens == pytest.approx((0.9 * 80e9 - 15.2e9) / PER_TOKEN)
    assert round(run.cluster.engines[7].kv_tokens) == 1_241_629  # (86.4 - 15.2) GB / 57,344 bytes
    assert spec.trainer.device.name == "h800" and not spec.trainer.same_node  # classes are separate nodes
    # an H20 decodes one row faster than an H800 (bandwidth: 4.0 against 3.35 TB/s), and prefills slower
    h800, h20 = run.cluster.engines[0].cost, run.cluster.engines[7].cost
    assert h20.decode_step_s(1, 512) < h800.decode_step_s(1, 512)
    assert h20.prefill_s(8192) > 5 * h800.prefill_s(8192)  # 148 against 989 TFLOP/s


def test_the_price_adds_every_pool_and_the_environment_hosts():
    spec = spec_of(MIXED, "simulate.env_price_per_hour=2.5")
    assert spec.price_per_hour == 4 * 3.0 + 2 * 3.0 + 6 * 1.0 + 2.5  # train h800, pool h800, pool h20, hosts
    result = simulate(spec)
    assert result.cost_per_1k_samples == pytest.approx(26.5 * 1000 / result.samples_per_s / 3600)
    plain = spec_of()
    assert plain.price_per_hour == 4 * 3.0 and plain.pools == () and plain.trainer is plain.cost


def test_a_pool_of_equal_cost_decodes_long_answers_faster_on_bandwidth_devices():
    """RollArt's decode-heavy case: 6 H20 (3x the engines, each with more bandwidth) against 2 H800. Long
    contexts make decoding read the KV cache; with short ones an H20 (148 TFLOP/s) is compute-bound at a
    large batch and loses (the sweep shows it: 1,000-token answers are 0.83x)."""
    long = ["simulate.workload.response_tokens=6000", "rollout.sampling.max_new_tokens=16384",
            "rollout.prompts_per_step=64", "simulate.workload.length_sigma=0.3"]
    h800 = simulate(spec_of("simulate.rollout_pools=[{device: h800, devices: 2}]", *long))
    h20 = simulate(spec_of("simulate.rollout_pools=[{device: h20, devices: 6}]", *long))
    assert h800.spec.price_per_hour == h20.spec.price_per_hour
    assert h20.mean("generate_s") < 0.8 * h800.mean("generate_s")


def test_pools_refuse_what_cannot_be_placed():
    with pytest.raises(ValueError, match="rollout.mode=hybrid samples with the policy's ranks"):
        spec_of(MIXED, "rollout.mode=hybrid", "rollout.backend=hf")
    with pytest.raises(ValueError, match="3 h20 devices are not whole engines of 2 devices"):
        spec_of("simulate.rollout_pools=[{device: h20, devices: 3}]", "simulate.rollout_tp=2")
    with pytest.raises(ValueError, match="--calibrate fits one device class"):
        scenario(load_config(CONFIG, [*BASE, MIXED]), 4, calibrate="metrics.jsonl")
    with pytest.raises(ValueError, match="unknown device class 'b300'"):
        load_config(CONFIG, [*BASE, "simulate.rollout_pools=[{device: b300, devices: 2}]"])


def test_memory_is_judged_on_each_sides_class():
    cfg = load_config(CONFIG, [*BASE, "policy.strategy=fsdp2", "simulate.model=32b",
                               "simulate.device=l40s", "simulate.rollout_pools=[{device: h20, devices: 8}]"])
    fit, device = spec_fit(cfg, scenario(cfg, 8))
    assert not fit.fits and device == "l40s"  # 32B's optimizer state on 8 L40S; the H20 engines hold 32B
    cfg = load_config(CONFIG, [*BASE, "policy.strategy=fsdp2", MIXED])
    fit, device = spec_fit(cfg, scenario(cfg, 8))
    assert fit.fits and device == "h800"
    # the largest engine: vLLM takes 0.9 of an H20's 96 GB
    assert fit.rollout_gb == pytest.approx(0.9 * 96, rel=0.02)
