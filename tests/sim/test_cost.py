"""The roofline cost model, against hand-computed step times."""

import pytest

from gyre.config.catalog import DeviceClass, ModelShape, device_class, model_shape
from gyre.sim.cost import CostModel

# A toy device and model whose numbers are easy to follow: 1e12 FLOP/s, 1e9 B/s, 1 ms per step.
DEVICE = DeviceClass("toy", peak_tflops=1.0, mem_gbps=1.0, mem_gb=10.0, price_per_hour=1.0, compute_eff=1.0,
                     mem_eff=1.0, step_overhead_s=0.001)
MODEL = ModelShape("toy", params=1e8, layers=2, kv_heads=1, head_dim=250)  # 2e8 B of weights, 2000 B of KV per token


def test_a_decoding_step_is_overhead_plus_the_larger_of_compute_and_memory():
    cost = CostModel(DEVICE, MODEL)
    assert MODEL.kv_bytes_per_token == 2000
    # 1 row, 1000 tokens of context: compute 2e8/1e12 = 0.2 ms; memory (2e8 + 2e6)/1e9 = 202 ms
    assert cost.decode_step_s(1, 1000) == pytest.approx(0.001 + 0.202)
    # 10,000 rows: compute 2e12/1e12 = 2 s beats memory (2e8 + 0)/1e9 = 0.2 s
    assert cost.decode_step_s(10_000, 0) == pytest.approx(0.001 + 2.0)


@pytest.mark.parametrize("rows,context", [(1, 1000), (64, 50_000), (3000, 0), (2000, 40_000)])
def test_a_span_in_closed_form_equals_the_sum_of_its_steps(rows, context):
    for cost in (CostModel(DEVICE, MODEL), CostModel(DeviceClass(**{**DEVICE.__dict__, "additive": True}), MODEL)):
        steps = 257
        by_step = sum(cost.decode_step_s(rows, context + j * rows) for j in range(steps))
        assert cost.decode_span_s(rows, context, steps) == pytest.approx(by_step, rel=1e-12)


@pytest.mark.parametrize("rows,context", [(1, 1000), (64, 50_000), (3000, 0), (2000, 40_000)])
def test_steps_within_inverts_the_span(rows, context):
    cost = CostModel(DEVICE, MODEL)
    for budget in (0.0005, 0.3, 1.7, 25.0, 400.0):
        k = cost.steps_within(rows, context, budget, 5000)
        assert cost.decode_span_s(rows, context, k) <= budget
        assert k == 5000 or cost.decode_span_s(rows, context, k + 1) > budget


def test_training_and_prefill_follow_their_flop_counts():
    cost = CostModel(DeviceClass(**{**DEVICE.__dict__, "train_mfu": 0.5, "train_overhead_s": 0.25}), MODEL)
    # (6 + 2 x 1) x 1e8 x 1e4 tokens = 8e12 FLOPs on 2 devices at 0.5 x 1e12: 8 s, plus the step's 0.25 s
    assert cost.train_s(1e4, devices=2, passes=4) == pytest.approx(8.25)
    # 5e4 tokens: 2 x 1e8 x 5e4 = 1e13 FLOPs = 10 s (above the 0.2 s weight read)
    assert cost.prefill_s(5e4) == pytest.approx(10.0)


def test_kv_capacity_and_a_model_that_does_not_fit():
    assert CostModel(DEVICE, MODEL).kv_capacity_tokens() == pytest.approx((10e9 - 2e8) * 0.9 / 2000)
    with pytest.raises(ValueError, match="rollout_tp"):
        CostModel(device_class("l40s"), model_shape("32b")).kv_capacity_tokens()
    assert CostModel(device_class("h100"), model_shape("32b"), tp=2).kv_capacity_tokens() > 0


def test_named_models_and_a_local_config(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 100, "num_'
                                          'attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128}')
    shape = model_shape(str(tmp_path))
    # per layer: q and o (64 x 16 x 4 each) + k and v (64 x 16 x 2 each) + MLP 3 x 64 x 128; embeddings in and out
    assert shape.params == 2 * (64 * 16 * 12 + 3 * 64 * 128) + 2 * 100 * 64
    assert shape.kv_bytes_per_token == 2 * 2 * 2 * 16 * 2
    with pytest.raises(ValueError, match="unknown model size"):
        model_shape("70q")


def test_training_counts_the_padding_its_micro_batches_carry():
    from gyre.sim.run import train_tokens

    rows = [5, 1, 9, 3, 2]
    assert train_tokens(rows, "pack", 2) == 20
    assert train_tokens(rows, "none", 2) == 2 * 5 + 2 * 9 + 1 * 2  # [5, 1] [9, 3] [2]
    assert train_tokens(rows, "sort", 2) == 2 * 9 + 2 * 3 + 1 * 1  # [9, 5] [3, 2] [1]


# ---- what gyre's own engines and transports cost (7B: W = 15.2 GB of bf16 weights, 28 layers) ----------------
H100, QWEN7B = device_class("h100"), model_shape("7b")


def sync_of(transport, same_node=True, device=H100):
    cost = CostModel(device, QWEN7B, transport=transport, same_node=same_node)
    return cost.sync_s(), cost.load_s()


def test_a_7b_weight_sync_costs_what_the_selected_transport_moves():
    # Pageable copies on an h100 host: 1 / (1 / 25 GB/s PCIe + 1 / 5 GB/s host copy) = 4.1667 GB/s.
    # channel: calls 0.05 + staging 3 x 15.2 / (3350 x 0.75) = 0.01815 + broadcast 15.2 / 350 = 0.04343
    # + 199 buckets x 0.5 ms = 0.0995 (the sender's host copy runs asynchronously afterwards); the engines wait
    # only for the calls, the broadcast and the buckets.
    assert sync_of("channel") == pytest.approx((0.05 + 0.018149 + 0.043429 + 0.0995, 0.05 + 0.043429 + 0.0995),
                                               rel=1e-4)
    # object store: rank 0 to pageable host buckets 3.648 + adler32 and put 2 x 15.2 / 5 = 6.08; each engine
    # (in parallel) verifies 3.04 and copies to its device 3.648.
    assert sync_of("object_store") == pytest.approx((0.05 + 3.648 + 6.08 + 3.04 + 3.648, 0.05 + 3.04 + 3.648), rel=1e-6)
    # hybrid: only the calls (the version stamp); with FSDP2 the ranks also gather 15.2 GB over NVLink.
    assert sync_of("none") == pytest.approx((0.05, 0.05))
    assert sync_of("gather") == pytest.approx((0.05 + 0.043429, 0.05 + 0.043429), rel=1e-4)
    # None: the generic model other systems are simulated with, 1 s + 15.2 GB / 25 GB/s, unchanged.
    assert sync_of(None) == pytest.approx((1.608, 1.608))


def test_across_nodes_the_weights_cross_the_network():
    # channel: the broadcast at 40 GB/s a device instead of NVLink's 350; object store: remote engines pull
    # the 15.2 GB over TCP at 2 GB/s first.
    assert sync_of("channel", False)[1] - sync_of("channel")[1] == pytest.approx(15.2 / 40 - 15.2 / 350)
    assert sync_of("object_store", False)[1] - sync_of("object_store")[1] == pytest.approx(15.2 / 2)
    assert sync_of("none", False) == sync_of("none")
    with pytest.raises(ValueError, match="unknown weight transport"):
        CostModel(H100, QWEN7B, transport="carrier pigeon")


def test_on_the_cpu_the_channel_is_a_little_faster_than_the_object_store():
    cpu, tiny = device_class("cpu"), ModelShape("tiny", 1e8, 4, 2, 64)  # 0.2 GB of weights
    channel = CostModel(cpu, tiny, transport="channel").sync_s()
    store = CostModel(cpu, tiny, transport="object_store").sync_s()
    # 5 host passes at 1.5 GB/s against 2 host passes + gloo at 0.9 GB/s (+ 31 buckets x 0.5 ms): 0.669 s / 0.505 s,
    # near bench/weight_transport.py's 1.34x at 336 MB
    assert store == pytest.approx(0.002028 + 5 * 0.2 / 1.5)
    assert channel == pytest.approx(0.002028 + 2 * 0.2 / 1.5 + 0.2 / 0.9 + 31 * 0.0005)
    assert 1.2 < store / channel < 1.45


def test_the_hf_engine_decodes_slower_than_vllm_until_the_device_work_hides_its_launches():
    from gyre.config.catalog import engine_class

    vllm = CostModel(H100, QWEN7B, engine=engine_class("vllm", H100))
    hf = CostModel(H100, QWEN7B, engine=engine_class("hf", H100))
    kv = QWEN7B.kv_bytes_per_token  # 57,344 B
    assert kv == 57_344
    # One row, 1000 tokens of context. vLLM (eager: 28 x 0.1 ms = 2.8 ms of launches, hidden by the weight
    # read): 4 ms + (15.2e9 + 1000 kv) / (3350e9 x 0.75) = 4 + 6.0726 ms.
    assert vllm.decode_step_s(1, 1000) == pytest.approx(0.004 + (15.2e9 + 1000 * kv) / 2.5125e12)
    # HF: 28 x 0.8 ms = 22.4 ms of launches exceed its weight read at 0.8 x the bandwidth (7.59 ms): 26.4 ms.
    assert hf.decode_step_s(1, 1000) == pytest.approx(0.004 + 0.0224)
    # 256 rows over 1.024 M tokens of (padded) context: the memory traffic, 7.562 + 29.21 ms, hides the launches.
    assert hf.decode_step_s(256, 1.024e6) == pytest.approx(0.004 + (15.2e9 + 1.024e6 * kv) / 2.01e12)
    assert hf.decode_step_s(1, 1000) / vllm.decode_step_s(1, 1000) == pytest.approx(2.62, abs=0.01)
    # The CPU class is fitted to the HF engine itself (its figures unchanged); vLLM there is 2x as fast.
    cpu, tiny = device_class("cpu"), ModelShape("tiny", 1e8, 4, 2, 64)
    assert CostModel(cpu, tiny, engine=engine_class("hf", cpu)).decode_step_s(8, 4000) == \
        CostModel(cpu, tiny).decode_step_s(8, 4000)
    assert CostModel(cpu, tiny, engine=engine_class("vllm", cpu)).decode_step_s(8, 4000) == \
        pytest.approx(CostModel(cpu, tiny).decode_step_s(8, 4000) / 2)
