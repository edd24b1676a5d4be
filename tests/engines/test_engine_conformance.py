"""The rollout-engine conformance suite: what every backend behind ``RolloutEngine`` must do, run against
each one installed (gyre's HF engine always; vLLM where ``vllm`` imports; the simulator's engine). An engine
upgrade is a run of this file. Engines are built once per module (vLLM starts in tens of seconds); a test
that changes the weights puts the originals back.

The simulator's engine samples no tokens (a sample's length comes from its workload, its tokens are
fillers): it is held to the lifecycle (protocol, budgets, aborts that keep tokens, continuation, weight
updates between steps, versions per token), and the tests of what was sampled (``sampler``) skip it."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from gyre.engines.base import RolloutEngine
from gyre.models.loading import load_causal_lm, load_tokenizer
from gyre.types import GenerationRequest, SamplingParams

BACKENDS = ["hf", pytest.param("vllm", marks=pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                                reason="vLLM is not installed (gyre[vllm])")),
            "sim"]


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def weights(tiny_model_dir):
    """The model's own weights, and a perturbed copy (a policy update)."""
    model = load_causal_lm(tiny_model_dir)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    return base, {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in base.items()}


@pytest.fixture(scope="module", params=BACKENDS)
def engine(request, tiny_model_dir, tok):
    if request.param == "hf":
        from gyre.engines.hf_rollout import HFRolloutEngine

        return HFRolloutEngine(load_causal_lm(tiny_model_dir), tok)
    if request.param == "sim":
        from gyre.config.catalog import DeviceClass, ModelShape
        from gyre.sim.cost import CostModel
        from gyre.sim.engine import SimEngine

        device = DeviceClass("toy", 1.0, 1.0, 10.0, 1.0, compute_eff=1.0, mem_eff=1.0, step_overhead_s=0.001)
        return SimEngine(CostModel(device, ModelShape("toy", 1e8, 2, 1, 250)), lambda request, i: 10**6)
    from gyre.engines.vllm_rollout import VLLMRolloutEngine

    return VLLMRolloutEngine(str(tiny_model_dir), tok, max_model_len=256, max_batch_size=64)


@pytest.fixture()
def fresh(engine, weights):
    """The engine idle, with the model's own weights at version 0, before and after the test."""
    assert not engine.busy
    yield engine
    engine.abort(engine.request_ids())
    engine.load_weights(weights[0], 0)


def samples_tokens(engine) -> bool:
    from gyre.sim.engine import SimEngine

    return not isinstance(engine, SimEngine)


@pytest.fixture()
def sampler(fresh):
    """``fresh``, for tests of what an engine sampled or of its weights: the simulator's engine has neither."""
    if not samples_tokens(fresh):
        pytest.skip("the simulator's engine samples no tokens and holds no weights (lengths come from its workload)")
    return fresh


def req(tok, text, params, n=1, seed=0, rid=None, prefix=()):
    return GenerationRequest(rid or text, tok(text)["input_ids"], params, n=n, seed=seed, prefix=tuple(prefix))


def forward_logprobs(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None])[:, 0]


def run_to_end(engine) -> list:
    out = []
    while engine.busy:
        out += engine.step()
    return out


def test_satisfies_the_protocol(engine):
    assert isinstance(engine, RolloutEngine)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_are_the_trainers_forward_pass(sampler, tok, tiny_model_dir, temperature):
    fresh = sampler
    model = load_causal_lm(tiny_model_dir)
    params = SamplingParams(temperature=temperature, max_new_tokens=16)
    results = fresh.generate([req(tok, p, params, n=3, seed=i) for i, p in enumerate(["12+34=", "5-9="])])
    assert [(r.request_id, r.sample_index) for r in results] == [(p, i) for p in ["12+34=", "5-9="] for i in range(3)]
    for r in results:
        assert len(r.logprobs) == len(r.response_ids) == len(r.versions) and r.versions == [0] * len(r.versions)
        expected = forward_logprobs(model, r.prompt_ids, r.response_ids, temperature)
        assert torch.allclose(torch.tensor(r.logprobs), expected, atol=1e-4), (r.logprobs, expected.tolist())


def test_a_seed_reproduces_its_samples_and_another_seed_differs(sampler, tok):
    fresh = sampler
    params = SamplingParams(temperature=1.0, max_new_tokens=24, ignore_eos=True)
    a = fresh.generate([req(tok, "7*8=", params, n=4, seed=3)])
    b = fresh.generate([req(tok, "7*8=", params, n=4, seed=3)])
    c = fresh.generate([req(tok, "7*8=", params, n=4, seed=4)])
    assert [r.response_ids for r in a] == [r.response_ids for r in b]
    assert [r.response_ids for r in a] != [r.response_ids for r in c]
    assert len({tuple(r.response_ids) for r in a}) > 1  # a request's samples are not copies of each other


def test_max_tokens_ends_a_sample_with_finish_reason_length(fresh, tok):
    long = fresh.generate([req(tok, "1+1=", SamplingParams(max_new_tokens=9, ignore_eos=True), n=2)])
    assert [(r.finish_reason, len(r.response_ids), len(r.logprobs)) for r in long] == [("length", 9, 9)] * 2


def test_stop_strings_end_a_sample_with_finish_reason_stop(sampler, tok):
    fresh = sampler
    stops = ("1", "2", "3", "4", "5")
    stopped = fresh.generate([req(tok, "9+9=", SamplingParams(max_new_tokens=64, stop=stops, ignore_eos=True),
                                  n=8, seed=1)])
    for r in stopped:
        assert r.finish_reason in ("stop", "length")
        if r.finish_reason == "stop":
            assert any(s in tok.decode(r.response_ids) for s in stops)
    assert any(r.finish_reason == "stop" for r in stopped)


def test_an_aborted_sample_keeps_its_tokens_and_continues_within_its_budget(fresh, tok):
    params = SamplingParams(temperature=1.0, max_new_tokens=30, ignore_eos=True)
    fresh.add([req(tok, "3+4=", params, n=2, seed=2, rid="x")])
    for _ in range(5):
        assert fresh.step() == []
    assert fresh.request_ids() == ["x"]
    aborted = fresh.abort(["x"])
    assert not fresh.busy and sorted(r.sample_index for r in aborted) == [0, 1]
    part = aborted[0]
    assert part.finish_reason == "abort" and 1 <= len(part.response_ids) < 30 and len(part.logprobs) == len(
        part.response_ids)
    [rest] = fresh.generate([req(tok, "3+4=", params, seed=2, rid="x2", prefix=part.response_ids)])
    assert rest.offset == len(part.response_ids) and len(rest.response_ids) == 30 - len(part.response_ids)
    assert rest.finish_reason == "length"


def test_a_weight_update_mid_flight_keeps_tokens_and_stamps_versions(fresh, tok, weights, tiny_model_dir):
    params = SamplingParams(temperature=1.0, max_new_tokens=20, ignore_eos=True)
    fresh.add([req(tok, "8-3=", params, n=2, seed=5, rid="y")])
    for _ in range(6):
        fresh.step()
    with pytest.raises(RuntimeError):
        fresh.load_weights(weights[1], 1)  # rows are decoding
    fresh.suspend()
    assert fresh.step() == [] and fresh.request_ids() == ["y"]
    fresh.load_weights(weights[1], 1)
    fresh.resume()
    assert fresh.weight_version == 1
    results = run_to_end(fresh)
    model = load_causal_lm(tiny_model_dir)
    model.load_state_dict(weights[1])
    for r in results:
        assert len(r.response_ids) == 20 and r.versions[0] == 0 and r.versions[-1] == 1
        assert list(r.versions) == sorted(r.versions)
        new = [i for i, v in enumerate(r.versions) if v == 1]
        if samples_tokens(fresh):
            expected = forward_logprobs(model, r.prompt_ids, r.response_ids, 1.0)[new]
            assert torch.allclose(torch.tensor(r.logprobs)[new], expected, atol=1e-4)  # sampled by the new weights


def test_an_incomplete_weight_update_is_refused_and_the_version_kept(sampler, tok, weights):
    partial = {k: v for k, v in weights[1].items() if "layers.0.self_attn.k_proj" not in k}
    with pytest.raises(KeyError, match="lacks 1 tensors.*k_proj"):
        sampler.load_weights(partial, 1)
    assert sampler.weight_version == 0
    sampler.load_weights(weights[1], 1)  # the complete update loads
    assert sampler.weight_version == 1


def test_a_lora_adapter_is_merged_into_the_base_weights(sampler, tok, weights, tiny_model_dir):
    """Two adapter versions in a row: each merged from the base weights (not on top of the last merge)."""
    fresh = sampler
    from gyre.models.lora import AdapterWeights, LoraTarget

    base = weights[0]
    layers = sorted({k[: -len(".weight")] for k in base if k.endswith("q_proj.weight")})[:2]
    gen = torch.Generator().manual_seed(1)
    model = load_causal_lm(tiny_model_dir)
    params = SamplingParams(temperature=1.0, max_new_tokens=12, ignore_eos=True)
    for version in (1, 2):
        factors = {layer: (torch.randn(4, base[f"{layer}.weight"].shape[1], generator=gen),
                           torch.randn(base[f"{layer}.weight"].shape[0], 4, generator=gen)) for layer in layers}
        targets = {layer: LoraTarget(scale=0.05) for layer in layers}
        fresh.load_adapter(AdapterWeights(factors, targets), version)
        merged = dict(base)
        for layer, (a, b) in factors.items():
            merged[f"{layer}.weight"] = base[f"{layer}.weight"] + 0.05 * b @ a
        model.load_state_dict(merged)
        [r] = fresh.generate([req(tok, "4+4=", params, seed=version)])
        assert r.versions == [version] * len(r.versions)
        expected = forward_logprobs(model, r.prompt_ids, r.response_ids, 1.0)
        assert torch.allclose(torch.tensor(r.logprobs), expected, atol=1e-4)
