"""rollout.tensor_parallel_size: engines over several GPUs (vLLM), their checks, the plan's engine count, the
report, the memory pre-flight and the simulator's default."""

import pytest

from gyre.config import ConfigError, load_config, make_plan
from gyre.config.catalog import ModelShape
from gyre.config.memory import GB, estimate
from gyre.config.report import format_plan

BASE = ["model.path=m", "data.train_files=[t.jsonl]", "rollout.backend=vllm", "policy.devices=[0,1]",
        "rollout.devices=[2,3,4,5]", "rollout.tensor_parallel_size=2"]


def config(*overrides):
    return load_config(None, BASE + list(overrides))


def test_engines_span_consecutive_devices_and_the_plan_counts_engines():
    cfg = config()
    plan = make_plan(cfg, "cuda", 6)
    assert plan.rollout_workers == 2 and plan.rollout_tp == 2
    assert plan.worker_devices("rollout") == ((2, 3), (4, 5))
    assert plan.worker_devices("policy") == ((0,), (1,))
    assert "  rollout    devices [2, 3, 4, 5]  (2 engines x TP 2: [2, 3], [4, 5])" in format_plan(cfg, plan)
    one = make_plan(config("rollout.tensor_parallel_size=1"), "cuda", 6)
    assert one.rollout_workers == 4 and one.worker_devices("rollout") == ((2,), (3,), (4,), (5,))


@pytest.mark.parametrize("overrides, kind, message", [
    (["rollout.backend=hf"], "cuda", r"rollout.tensor_parallel_size=2 splits each engine over 2 GPUs, which only "
                                     r"vLLM engines do \(rollout.backend=hf .*set rollout.backend=vllm"),
    ([], "cpu", r"CPU slots: set rollout.tensor_parallel_size=1"),
    (["rollout.devices=[2,3,4]"], "cuda", r"rollout.devices=\[2, 3, 4\] \(3 devices\), which must be a multiple "
                                          r"of 2"),
    (["rollout.devices=[0,1]"], "cuda", r"policy shares devices \[0, 1\] with the rollout, and colocated tensor "
                                        r"parallelism is not supported"),
    (["algorithm.kl.loss_coef=0.1", "reference.devices=[5]"], "cuda", r"reference shares devices \[5\]"),
])
def test_what_tensor_parallelism_refuses_names_the_key_to_change(overrides, kind, message):
    with pytest.raises(ConfigError, match=message):
        make_plan(config(*overrides), kind, 6)


# 1e9 parameters in bfloat16: 2 GB of weights.
SHAPE = ModelShape("t", params=1e9, layers=10, kv_heads=2, head_dim=64, hidden=1024, vocab=1000)


def rollout_memory(tp: int, device_gb):
    cfg = config(f"rollout.tensor_parallel_size={tp}", "model.dtype=bfloat16", "data.max_prompt_tokens=100")
    m = estimate(cfg, make_plan(cfg, "cuda", 6), SHAPE, device_gb)
    return next(r for r in m.roles if r.role == "rollout"), m


def test_the_memory_preflight_splits_an_engines_weights_over_its_devices():
    alone, _ = rollout_memory(1, None)
    split, _ = rollout_memory(2, None)
    assert alone.terms == {"weights": 2e9} and split.terms == {"weights (1/2 per device)": 1e9}
    # 2 GB of weights overflow vLLM's 90% of a 2 GB device (1.8 GB): refused at TP 1, fits at TP 2.
    alone, m1 = rollout_memory(1, 2.0)
    split, m2 = rollout_memory(2, 2.0)
    assert alone.total == 2e9 and [p for p in m1.problems() if p.startswith("device 2:")]
    assert split.terms == pytest.approx({"vLLM reservation (90%)": 0.9 * 2 * GB})
    assert not [p for p in m2.problems() if p.startswith(("device 2:", "device 5:"))]


def test_the_simulator_takes_the_runs_tensor_parallelism_unless_told_otherwise():
    from gyre.sim.scenario import layout

    assert layout(config(), 8).tp == 2
    assert layout(config("simulate.rollout_tp=4"), 8).tp == 4
