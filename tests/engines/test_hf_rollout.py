import pytest
import torch

from gyre.engines.base import RolloutEngine
from gyre.engines.hf_rollout import HFRolloutEngine
from gyre.engines.sampling import filter_logits
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
        assert r.versions == [0] * len(r.response_ids) and len(r.logprobs) == len(r.response_ids)


def test_the_cache_goes_by_the_name_the_model_takes(engine, tok):
    """transformers renamed forward's ``past_key_values`` to ``cache`` (the old name warns, then goes in
    5.40): the engine passes whichever name the installed release takes, so decoding raises no warning."""
    import inspect
    import warnings

    params = SamplingParams(temperature=1.0, max_new_tokens=4)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*")
        assert len(engine.generate([req(tok, "1+1=", params, n=2), req(tok, "12+3=", params)])) == 3
    takes = inspect.signature(engine.model.forward).parameters
    assert engine._cache_key == ("cache" if "cache" in takes else "past_key_values")


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


# ---- per-request control: continuous batching, abort, continuation, suspend / update / resume ----------
SAMPLED = SamplingParams(temperature=1.0, max_new_tokens=10)


def run_to_end(engine):
    out = []
    while engine.busy:
        out += engine.step()
    return {(r.request_id, r.sample_index): r for r in out}


def test_a_request_joining_mid_generation_samples_as_if_alone(engine, tok):
    alone = engine.generate([req(tok, "9+9=", SAMPLED, n=2, seed=4, rid="late")])
    engine.add([req(tok, "12+345=", SAMPLED, n=3, seed=1, rid="early")])
    finished = engine.step() + engine.step() + engine.step()  # three tokens into the first request
    engine.add([req(tok, "9+9=", SAMPLED, n=2, seed=4, rid="late")])
    results = run_to_end(engine)
    assert all(r.request_id == "early" for r in finished) and len(finished) < 3
    assert [results[("late", i)].response_ids for i in range(2)] == [r.response_ids for r in alone]
    assert sorted(k for k in results if k[0] == "early") == [("early", i) for i in range(3) if
                                                            ("early", i) not in {(r.request_id, r.sample_index)
                                                                                 for r in finished}]


def test_split_requests_keep_their_sample_streams(engine, tok):
    whole = engine.generate([req(tok, "5*5=", SAMPLED, n=3, seed=9, rid="g")])
    split = engine.generate([GenerationRequest(f"g/{i}", tok("5*5=")["input_ids"], SAMPLED, n=1, seed=9,
                                               first_sample=i) for i in range(3)])
    assert [r.sample_index for r in split] == [0, 1, 2]
    assert [r.response_ids for r in split] == [r.response_ids for r in whole]


def test_an_aborted_request_continues_to_the_uninterrupted_tokens(engine, tok):
    long = SamplingParams(temperature=1.0, max_new_tokens=14)
    (full,) = engine.generate([req(tok, "77+88=", long, seed=3, rid="a")])
    engine.add([req(tok, "77+88=", long, seed=3, rid="a"), req(tok, "1+2=", long, seed=5, rid="b")])
    for _ in range(4):
        assert not [r for r in engine.step() if r.request_id == "a"]
    (partial,) = engine.abort(["a"])
    assert partial.finish_reason == "abort" and partial.response_ids == full.response_ids[:4]
    rest = GenerationRequest("a", partial.prompt_ids, long, seed=3, prefix=tuple(partial.response_ids))
    engine.add([rest])
    results = run_to_end(engine)
    cont = results[("a", 0)]
    assert cont.offset == 4 and partial.response_ids + cont.response_ids == full.response_ids
    assert partial.logprobs + cont.logprobs == pytest.approx(full.logprobs, abs=1e-5)
    assert cont.response_text == full.response_text and cont.finish_reason == full.finish_reason


def test_suspend_update_resume_keeps_tokens_and_stamps_versions(engine, tok):
    long = SamplingParams(temperature=1.0, max_new_tokens=12)
    (full,) = engine.generate([req(tok, "40-13=", long, seed=8, rid="s")])
    engine.add([req(tok, "40-13=", long, seed=8, rid="s")])
    for _ in range(5):
        engine.step()
    engine.suspend()
    assert engine.step() == []  # suspended: nothing decodes
    same = {k: v.clone() for k, v in engine.model.state_dict().items()}
    engine.load_weights(same, version=1)  # unchanged weights under a new version
    engine.resume()
    (result,) = run_to_end(engine).values()
    assert result.response_ids == full.response_ids  # re-prefilled, then continued exactly
    assert result.versions == [0] * 5 + [1] * (len(full.response_ids) - 5)


def test_load_weights_refuses_while_decoding(engine, tok):
    engine.add([req(tok, "1+1=", SAMPLED, rid="x")])
    engine.step()
    with pytest.raises(RuntimeError, match="suspend it"):
        engine.load_weights(engine.model.state_dict(), version=1)


def test_a_full_batch_queues_requests_until_rows_free(engine, tok):
    engine.max_batch_size = 2
    params = SamplingParams(temperature=0.0, max_new_tokens=5)
    requests = [req(tok, f"{i}{i}+1=", params, rid=f"q{i}") for i in range(5)]
    engine.add(requests)
    engine.step()
    assert len(engine._batch) <= 2 and len(engine._waiting) >= 3
    queued = run_to_end(engine)
    engine.max_batch_size = None
    alone = {(r.request_id, r.sample_index): r for r in engine.generate(requests)}
    assert {k: r.response_ids for k, r in queued.items()} == {k: r.response_ids for k, r in alone.items()}


def test_a_kv_token_budget_admits_rows_by_their_final_length_and_samples_alike(engine, tok):
    """Each row of "i+i=" (4 prompt tokens) may grow to 4 + 6 = 10 tokens: a 25-token budget holds two
    rows (3 x 10 > 25), and the samples are the unbudgeted engine's (they do not depend on the batch)."""
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    requests = [req(tok, f"{i}+{i}=", params, n=2, seed=i) for i in range(3)]
    alone = {(r.request_id, r.sample_index): r.response_ids for r in engine.generate(requests)}
    engine.max_batch_tokens = 25
    engine.add(requests)
    budgeted = {}
    while engine.busy:
        for r in engine.step():
            budgeted[(r.request_id, r.sample_index)] = r.response_ids
        live = [row for row in engine._batch.rows if row.finish is None] if engine._batch else []
        assert len(live) <= 2
    assert budgeted == alone


def test_prefill_in_chunks_of_a_token_budget_gives_the_same_samples(engine, tok, monkeypatch):
    params = SamplingParams(temperature=1.0, max_new_tokens=5)
    requests = [req(tok, f"{i}{i}+{i}=", params, n=3, seed=i) for i in range(4)]  # 4 contexts of 6 tokens
    alone = {(r.request_id, r.sample_index): r.response_ids for r in engine.generate(requests)}
    passes = []
    prefill = engine._prefill
    monkeypatch.setattr(engine, "_prefill", lambda rows: passes.append(len({tuple(r.context) for r in rows}))
                        or prefill(rows))
    engine.max_prefill_tokens = 12  # two 6-token contexts a pass; a context's 3 rows share it
    chunked = {(r.request_id, r.sample_index): r.response_ids for r in engine.generate(requests)}
    assert chunked == alone and passes == [2, 2]


def test_an_engine_over_float32_weights_can_sample_in_bfloat16(tiny_model_dir, tok):
    """A hybrid policy rank holds float32 master weights and samples under autocast in its compute dtype
    (on GPUs; CPU autocast stands in here): log-probs are those of a bfloat16 forward pass, not float32's."""
    model = load_causal_lm(tiny_model_dir)
    engine = HFRolloutEngine(model, tok, autocast_dtype=torch.bfloat16)
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    result = engine.generate([req(tok, "12+34=", params, seed=3)])[0]
    ids = torch.tensor([result.prompt_ids + result.response_ids])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(ids).logits.float()
    with torch.no_grad():
        exact = model(ids).logits
    start = len(result.prompt_ids) - 1
    autocast_ref = token_logprobs(logits[:, :-1], ids[:, 1:], 1.0)[0, start:]
    float_ref = token_logprobs(exact[:, :-1], ids[:, 1:], 1.0)[0, start:]
    got = torch.tensor(result.logprobs)
    assert (got - autocast_ref).abs().max() < (got - float_ref).abs().max()
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the weights stay float32
