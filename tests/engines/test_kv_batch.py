"""The running batch's KV cache: room reserved once, columns appended in place."""

import torch

from gyre.engines.hf_rollout import HFRolloutEngine
from gyre.engines.kv_batch import append_in_place, room, roomy_cache
from gyre.models.loading import load_causal_lm, load_tokenizer
from gyre.types import GenerationRequest, SamplingParams


def test_room_is_what_a_wider_buffer_leaves_after_the_view():
    buffer = torch.zeros(2, 3, 10, 4)
    assert room(buffer[:, :, :6]) == 4
    assert room(buffer[:, :, 2:6]) == 4  # a view trimmed at the front keeps the room behind it
    assert room(buffer) == 0
    assert room(torch.zeros(2, 3, 6, 4)) == 0  # an ordinary tensor has none
    assert room(buffer[:1, :, :6]) == 4
    assert room(buffer.transpose(1, 2)[:, :3]) == 0  # other strides: never grown


def test_append_in_place_writes_after_the_view_and_copies_nothing():
    buffer = torch.zeros(1, 2, 5, 3)
    view = buffer[:, :, :2]
    view.fill_(1.0)
    grown = append_in_place(view, torch.full((1, 2, 1, 3), 2.0))
    assert grown.shape == (1, 2, 3, 3) and grown.data_ptr() == buffer.data_ptr()
    assert buffer[0, 1, :, 0].tolist() == [1.0, 1.0, 2.0, 0.0, 0.0]
    assert room(grown) == 2


def test_a_decoding_batch_appends_without_copying_its_cache(tiny_model_dir, monkeypatch):
    """Between changes of the batch every step writes its column into the same buffers; the samples are
    those of a plain (concatenating) cache."""
    tok = load_tokenizer(tiny_model_dir)
    engine = HFRolloutEngine(load_causal_lm(tiny_model_dir), tok)
    params = SamplingParams(temperature=1.0, max_new_tokens=8, ignore_eos=True)
    requests = [GenerationRequest(f"r{i}", tok(f"{i}+{i}=")["input_ids"], params, n=2, seed=i) for i in range(2)]
    engine.add(requests)
    storages, results = [], []
    while engine.busy:
        results += engine.step()
        if engine._batch is not None:
            layer = engine._batch.cache.layers[0]
            storages.append((layer.keys.untyped_storage().data_ptr(), layer.keys.shape[2]))
    assert len(storages) >= 6
    assert len({ptr for ptr, _ in storages[1:]}) == 1  # one buffer from the first decoding step on
    assert [width for _, width in storages] == sorted(width for _, width in storages)

    from transformers import DynamicCache

    monkeypatch.setattr("gyre.engines.hf_rollout.roomy_cache", lambda config: DynamicCache(config=config))
    reference = HFRolloutEngine(load_causal_lm(tiny_model_dir), tok).generate(requests)
    key = lambda r: (r.request_id, r.sample_index)  # noqa: E731
    assert {key(r): r.response_ids for r in results} == {key(r): r.response_ids for r in reference}
    assert {key(r): r.logprobs for r in results} == {key(r): r.logprobs for r in reference}


def test_a_roomy_cache_leaves_layers_it_cannot_grow_alone(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir)
    cache = roomy_cache(model.config)
    assert all(type(layer).__name__ == "RoomyLayer" for layer in cache.layers)


def test_a_memory_share_becomes_a_kv_budget_beside_what_the_process_holds(tiny_model_dir, monkeypatch):
    """The tiny preset: 2 layers x 4 KV heads x 32 dims, keys and values in float32 = 2048 bytes a token.
    Half of a 10,388,608-byte device with 1,000,000 bytes held leaves 4 MiB: 2048 tokens; max_batch_tokens
    caps it."""
    import types

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(
        total_memory=10_388_608))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 1e6)
    tok = load_tokenizer(tiny_model_dir)
    engine = HFRolloutEngine(load_causal_lm(tiny_model_dir), tok, memory_share=0.5)
    assert engine.kv_budget() is None  # on CPU the share means nothing
    engine.device = torch.device("cuda")  # only the budget's arithmetic is exercised here
    assert engine.kv_budget() == 2048
    engine.max_batch_tokens = 1000
    assert engine.kv_budget() == 1000
    engine.autocast_dtype = torch.bfloat16
    engine._share_budget = None  # measured again (as after an offload): bf16 keys and values, 4096 tokens
    engine.max_batch_tokens = None
    assert engine.kv_budget() == 4096
