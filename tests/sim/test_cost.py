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
    assert cost.train_s(1e4, devices=2, forward_passes=1) == pytest.approx(8.25)
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
