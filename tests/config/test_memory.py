"""The memory pre-flight (gyre.config.memory): each term by hand on a made-up shape, and the shipped cluster
example checked against a 7B model on 80 GB GPUs."""

from pathlib import Path

import pytest

from gyre.config import load_config, make_plan
from gyre.config.catalog import MODELS, ModelShape
from gyre.config.memory import GB, estimate

# 1e9 parameters, 10 layers, hidden 1024, 2 KV heads of 64: KV 2 x 10 x 2 x 64 x 2 = 5120 bytes a token (bf16).
SHAPE = ModelShape("t", params=1e9, layers=10, kv_heads=2, head_dim=64, hidden=1024, vocab=1000)
BASE = ["model.path=m", "data.train_files=[t.jsonl]", "model.dtype=bfloat16", "data.max_prompt_tokens=100",
        "rollout.sampling.max_new_tokens=156", "rollout.max_batch_size=8"]


def memory(*overrides, kind="cuda", device_gb=80.0):
    cfg = load_config(None, BASE + list(overrides))
    plan = make_plan(cfg, kind, 4)
    return plan, estimate(cfg, plan, SHAPE, device_gb)


def test_each_term_by_hand():
    plan, m = memory("policy.devices=[0,1]", "policy.strategy=fsdp2", "policy.micro_batch_tokens=1000",
                     "rollout.devices=[2]")
    policy, rollout = m.roles
    assert policy.terms == pytest.approx({
        "weights": 1e9 * 4 / 2, "gradients": 1e9 * 4 / 2, "optimizer": 1e9 * 8 / 2,  # float32 master, sharded
        "gathered layers": 2 * 1e9 / 10 * 2,  # this layer and the prefetched one, bf16
        "activations": 1000 * 1024 * 17 * 10 * 2,  # 17 h values a token a layer, bf16
        "logits": 1000 * 1000 * 8,  # float32 logits and their gradient
        "weight channel staging": 1e9 * 2})
    assert rollout.terms == pytest.approx({"weights": 1e9 * 2, "KV cache": 8 * 256 * 5120,  # rows x prompt + answer
                                           "decode logits": 8 * 1000 * 4})
    assert m.devices == pytest.approx({0: policy.total, 1: policy.total, 2: rollout.total})
    assert not m.problems()


def test_levers_move_their_terms():
    _, plain = memory("policy.devices=[0]", "policy.micro_batch_size=4", "rollout.devices=[1]")
    _, levers = memory("policy.devices=[0]", "policy.micro_batch_size=4", "rollout.devices=[1]",
                       "model.gradient_checkpointing=true", "policy.logprob_chunk_tokens=128",
                       "rollout.weight_transport=object_store")
    tokens = 4 * 256  # rows x the longest sample
    assert plain.roles[0].terms["activations"] == tokens * 1024 * 17 * 10 * 2
    assert levers.roles[0].terms["activations"] == tokens * 1024 * (10 + 17) * 2  # layer inputs + one recomputed
    assert levers.roles[0].terms["logits"] == 128 * 1000 * 8 and "weight channel staging" not in levers.roles[0].terms
    assert plain.roles[0].terms["weights"] == 4e9  # DDP holds the whole float32 model


def test_an_engine_without_a_row_cap_holds_every_sample_a_step_may_give_it():
    _, m = memory("rollout.max_batch_size=null", "rollout.prompts_per_step=8", "rollout.samples_per_prompt=8",
                  "rollout.async_ratio=1", "policy.devices=[0]", "rollout.devices=[1,2]")
    rows = 8 * 8 // 2 * 2  # the step's samples over two engines, two batches in flight at alpha 1
    assert m.roles[1].terms["KV cache"] == rows * 256 * 5120


def test_colocated_roles_add_up_unless_offloaded_and_a_plan_that_cannot_fit_names_its_devices():
    _, shared = memory("policy.devices=[0]", "rollout.devices=[0]", "policy.offload=never", device_gb=16)
    policy, rollout = shared.roles
    assert shared.devices[0] == pytest.approx(policy.total + rollout.total)
    peak = shared.devices[0] / GB
    assert shared.problems() == [f"device 0: about {peak:.1f} GB estimated, more than 90% of its 16 GB"]
    _, offloaded = memory("policy.devices=[0]", "rollout.devices=[0]", "policy.offload=always", device_gb=16)
    assert offloaded.devices[0] == pytest.approx(max(r.total for r in offloaded.roles))
    _, unknown = memory("policy.devices=[0]", "rollout.devices=[0]", "policy.offload=never", device_gb=None)
    assert not unknown.problems()  # no device memory known: estimates, no verdict


def test_the_shipped_cluster_example_fits_a_7b_model_on_80_gb():
    cfg = load_config(Path(__file__).parents[2] / "examples" / "grpo_gpu_cluster.yaml", [])
    m = estimate(cfg, make_plan(cfg, "cuda", 8), MODELS["7b"], 80.0)
    assert not m.problems(), [r.describe() for r in m.roles]
    # Without its row cap the engines would hold every row's KV cache padded to 6k tokens: far past 80 GB.
    uncapped = load_config(Path(__file__).parents[2] / "examples" / "grpo_gpu_cluster.yaml",
                           ["rollout.max_batch_size=256"])
    assert estimate(uncapped, make_plan(uncapped, "cuda", 8), MODELS["7b"], 80.0).problems()


def test_lora_trains_the_adapters_alone_and_an_episode_is_as_long_as_its_context():
    _, m = memory("policy.devices=[0]", "rollout.devices=[1]", "policy.lora={r: 8, target_modules: [q_proj, v_proj]}")
    share = 2 * 10 * 2 * 8 * 1024 / 1e9  # two targets a layer, A and B of rank 8 on a 1024-wide model
    assert m.roles[0].terms["gradients"] == pytest.approx(1e9 * share * 4)
    assert m.roles[0].terms["optimizer"] == pytest.approx(1e9 * share * 8)
    _, env = memory("policy.devices=[0]", "rollout.devices=[1]", "data=null", "env.id=gyre.envs.guess:GuessNumber",
                    "env.context_tokens=300")
    assert env.roles[1].terms["KV cache"] == 8 * 300 * 5120


def test_an_engines_kv_budget_caps_its_cache_estimate():
    _, capped = memory("policy.devices=[0]", "rollout.devices=[1]", "rollout.max_batch_tokens=1000")
    assert capped.roles[1].terms["KV cache"] == 1000 * 5120  # 8 rows x 256 tokens would be 2048
    _, tiny = memory("policy.devices=[0]", "rollout.devices=[1]", "rollout.max_batch_tokens=10")
    assert tiny.roles[1].terms["KV cache"] == 256 * 5120  # a row alone always runs


def test_an_engines_memory_share_caps_its_cache_beside_its_weights():
    # Half of 4.01048576 GB is 2 GB of bf16 weights plus 1024 x 5120 bytes: room for 1024 cached tokens,
    # under the 8 rows x 256 tokens the row cap allows; half of 8 GB leaves room for all 2048.
    _, tight = memory("policy.devices=[0]", "rollout.devices=[1]", "rollout.gpu_memory_utilization=0.5",
                      device_gb=4.01048576)
    assert tight.roles[1].terms["KV cache"] == pytest.approx(1024 * 5120)
    _, loose = memory("policy.devices=[0]", "rollout.devices=[1]", "rollout.gpu_memory_utilization=0.5", device_gb=8)
    assert loose.roles[1].terms["KV cache"] == 2048 * 5120
    _, vllm = memory("policy.devices=[0]", "rollout.devices=[1]", "rollout.backend=vllm",
                     "rollout.gpu_memory_utilization=0.5", device_gb=80)
    assert vllm.roles[1].terms == {"vLLM reservation (50%)": 40e9}
