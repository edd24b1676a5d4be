import pytest
import torch

from gyre.engines.base import RolloutEngine
from gyre.engines.hf_rollout import HFRolloutEngine, filter_logits
from gyre.models.loading import load_causal_lm, load_tokenizer
from gyre.models.logprobs import token_logprobs
from gyre.types import GenerationRequest, SamplingParams


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.fixture()
def engine(tiny_model_dir, tok):
    return HFRolloutEngine(load_causal_lm(tiny_model_dir), tok)


def req(tok, text, params, n=1, seed=0, rid=None):
    return GenerationRequest(rid or text, tok(text)["input_ids"], params, n=n, seed=seed)


def test_engine_satisfies_protocol(engine):
    assert isinstance(engine, RolloutEngine)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_logprobs_match_a_full_forward(engine, tok, temperature):
    params = SamplingParams(temperature=temperature, max_new_tokens=12, stop=("3", "7"))
    requests = [req(tok, p, params, n=4, seed=i) for i, p in enumerate(["12+34=", "5-9=", "100+1="])]
    results = engine.generate(requests)
    assert len(results) == 12
    assert [(r.request_id, r.sample_index) for r in results] == [(q.request_id, i) for q in requests for i in range(4)]
    for r in results:
        ids = torch.tensor([r.prompt_ids + r.response_ids])
        with torch.no_grad():
            logits = engine.model(ids).logits
        ref = token_logprobs(logits[:, :-1], ids[:, 1:], temperature)[0, len(r.prompt_ids) - 1:]
        assert torch.allclose(torch.tensor(r.logprobs), ref, atol=1e-4), r.finish_reason
        assert r.weight_version == 0 and len(r.logprobs) == len(r.response_ids)


def test_same_seed_same_samples_other_seed_differs(engine, tok):
    params = SamplingParams(temperature=1.0, max_new_tokens=16)
    a = engine.generate([req(tok, "1+1=", params, n=3, seed=5)])
    b = engine.generate([req(tok, "1+1=", params, n=3, seed=5)])
    c = engine.generate([req(tok, "1+1=", params, n=3, seed=6)])
    assert [r.response_ids for r in a] == [r.response_ids for r in b]
    assert [r.response_ids for r in a] != [r.response_ids for r in c]


def test_stop_conditions(tiny_model_dir, tok):
    model = load_causal_lm(tiny_model_dir)
    engine = HFRolloutEngine(model, tok)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    (full,) = engine.generate([req(tok, "7*8=", greedy)])
    assert full.finish_reason == "length" and len(full.response_ids) == 8
    # A stop string made of the 3rd generated character ends the response right after it.
    stop_char = full.response_text[2]
    first = full.response_text.index(stop_char)
    stop_params = SamplingParams(temperature=0.0, max_new_tokens=8, stop=(stop_char,))
    (stopped,) = engine.generate([req(tok, "7*8=", stop_params)])
    assert stopped.finish_reason == "stop" and stopped.response_text == full.response_text[:first + 1]
    # EOS ids also come from the generation config: make the first greedy token an end-of-sequence id.
    model.generation_config.eos_token_id = [tok.eos_token_id, full.response_ids[0]]
    (eos,) = HFRolloutEngine(model, tok).generate([req(tok, "7*8=", greedy)])
    assert eos.finish_reason == "eos" and eos.response_ids == full.response_ids[:1]


def test_max_batch_size_chunks_give_the_same_greedy_answers(engine, tok):
    params = SamplingParams(temperature=0.0, max_new_tokens=6)
    requests = [req(tok, f"{i}+{i}=", params, n=2) for i in range(5)]
    together = engine.generate(requests)
    engine.max_batch_size = 3
    chunked = engine.generate(requests)
    assert [r.response_ids for r in together] == [r.response_ids for r in chunked]


def test_load_weights_sets_version_and_changes_outputs(tiny_model_dir, tok, tmp_path):
    from gyre.models.presets import init_model

    other = load_causal_lm(init_model("tiny", tmp_path / "other", seed=1))
    engine = HFRolloutEngine(load_causal_lm(tiny_model_dir), tok)
    params = SamplingParams(temperature=0.0, max_new_tokens=8)
    before = engine.generate([req(tok, "3+4=", params)])[0]
    engine.load_weights(other.state_dict(), version=3)
    after = engine.generate([req(tok, "3+4=", params)])[0]
    assert after.weight_version == 3 and before.response_ids != after.response_ids
    with pytest.raises(KeyError, match="lacks"):
        engine.load_weights({"model.norm.weight": torch.ones(128)}, version=4)


def test_filter_logits_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, top_k=2, top_p=1.0)).tolist() == [[False, False, True, True]]
    # top_p 0.7: 0.5 < 0.7 so the 2nd token (cumulative before it 0.5) stays; the 3rd (0.8 before it) goes.
    assert torch.isinf(filter_logits(logits, top_k=0, top_p=0.7)).tolist() == [[False, False, True, True]]
    # top_p 0.5: mass before the 2nd token is exactly 0.5 -> dropped; the top token always stays.
    assert torch.isinf(filter_logits(logits, top_k=0, top_p=0.5)).tolist() == [[False, True, True, True]]
    assert torch.isinf(filter_logits(logits, top_k=0, top_p=0.01)).tolist() == [[False, True, True, True]]


def test_samples_do_not_depend_on_batch_composition(engine, tok):
    """A request's samples come from its own seeded stream, whoever shares its batch."""
    params = SamplingParams(temperature=1.0, max_new_tokens=10, stop=("5",))
    alone = engine.generate([req(tok, "12+34=", params, n=3, seed=11)])
    crowd = engine.generate([req(tok, "9+9=", params, n=5, seed=1), req(tok, "12+34=", params, n=3, seed=11),
                             req(tok, "70+1=", params, n=2, seed=2)])
    assert [r.response_ids for r in alone] == [r.response_ids for r in crowd if r.request_id == "12+34="]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_bf16_engine_on_gpu_matches_a_forward_and_offloads(tiny_model_dir, tok):
    engine = HFRolloutEngine(load_causal_lm(tiny_model_dir, "bfloat16", device="cuda"), tok, "cuda")
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    results = engine.generate([req(tok, "12+34=", params, n=4, seed=3)])
    for r in results:
        ids = torch.tensor([r.prompt_ids + r.response_ids], device="cuda")
        with torch.no_grad():
            logits = engine.model(ids).logits
        ref = token_logprobs(logits[:, :-1], ids[:, 1:])[0, len(r.prompt_ids) - 1:].cpu()
        assert torch.allclose(torch.tensor(r.logprobs), ref, atol=5e-2)
    engine.offload()
    assert next(engine.model.parameters()).device.type == "cpu"
    engine.reload()
    assert len(engine.generate([req(tok, "1+1=", params, n=2)])) == 2


def test_streamed_parts_are_the_batched_samples(tiny_model_dir):
    """generate_stream hands out finished samples in parts; together they are exactly generate's."""
    from gyre.engines.hf_rollout import HFRolloutEngine
    from gyre.models.loading import load_causal_lm, load_tokenizer
    from gyre.types import GenerationRequest, SamplingParams

    engine = HFRolloutEngine(load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir), "cpu")
    # Stop strings on common characters make the (untrained) rows finish at different steps.
    params = SamplingParams(temperature=1.0, max_new_tokens=16, stop=tuple("aeiou0123"))
    requests = [GenerationRequest(f"r{i}", [3 + i, 7, 9], params, n=8, seed=i) for i in range(4)]
    parts = list(engine.generate_stream(requests))
    batched = engine.generate(requests)
    assert len(parts) > 1  # the early finishers come out before the rest are decoded
    assert len(list(engine.generate_stream(requests, parts=1))) == 1  # one part per chunk
    streamed = sorted((r for p in parts for r in p), key=lambda r: (r.request_id, r.sample_index))
    assert [(r.request_id, r.sample_index, r.response_ids) for r in streamed] == \
        [(r.request_id, r.sample_index, r.response_ids) for r in batched]
