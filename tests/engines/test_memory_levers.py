"""Memory levers (token-budget micro-batches, padding removal, packing, chunked log-probs, gradient
checkpointing) compute the plain path's log-probs, loss and gradient, on a real tiny model in float32."""

import pytest
import torch

from gyre.algos.aggregation import denominator_for
from gyre.algos.specs import KLSpec
from gyre.data.batching import collate
from gyre.engines.forward import ForwardContext, ReferenceModel, micro_batches, sequence_logprobs, sequence_values
from gyre.engines.logit_head import check_chunkable
from gyre.engines.losses import PolicyLoss, PolicyLossSpec, ValueLoss
from gyre.engines.memory import enable_activation_checkpointing
from gyre.engines.microbatch import plan_micro_batches, split_to_count
from gyre.engines.packing import RowLayout, block_causal_mask
from gyre.engines.specs import MemoryLevers
from gyre.models.loading import load_causal_lm, load_value_model
from gyre.types import MetricSums

CPU = torch.device("cpu")
LEVERS = {
    "pack": MemoryLevers(remove_padding="pack"),
    "chunk": MemoryLevers(logprob_chunk_tokens=7),
    "sort+tokens": MemoryLevers(micro_batch_tokens=40, remove_padding="sort"),
    "pack+tokens+chunk": MemoryLevers(micro_batch_tokens=24, remove_padding="pack", logprob_chunk_tokens=5),
}


def _plan(lengths, rows=2, **levers):
    return [g.tolist() for g in plan_micro_batches(torch.tensor(lengths), rows, MemoryLevers(**levers))]


def test_micro_batch_plans_hand_computed():
    lengths = [5, 2, 7, 3, 3]
    assert _plan(lengths) == [[0, 1], [2, 3], [4]]  # consecutive rows, as before
    assert _plan(lengths, remove_padding="sort") == [[2, 0], [3, 4], [1]]  # longest first
    # Padded cost = rows x longest: [0,1] = 2 x 5 = 10; [2] alone (3 x 7 > 10); [3,4] = 2 x 3.
    assert _plan(lengths, micro_batch_tokens=10) == [[0, 1], [2], [3, 4]]
    assert _plan(lengths, micro_batch_tokens=10, remove_padding="sort") == [[2], [0, 3], [4, 1]]
    # Packed cost = sum of lengths: 5 + 3 + 3 = 11 fits, 11 + 2 does not.
    assert _plan(lengths, micro_batch_tokens=11, remove_padding="pack") == [[2], [0, 3, 4], [1]]
    assert _plan(lengths, micro_batch_tokens=4, remove_padding="pack") == [[2], [0], [3], [4], [1]]  # too long: alone
    groups = plan_micro_batches(torch.tensor(lengths), 2, MemoryLevers(micro_batch_tokens=11, remove_padding="pack"))
    assert [g.tolist() for g in split_to_count(groups, 4)] == [[2], [0, 3], [4], [1]]
    with pytest.raises(ValueError, match="cannot make 6 micro-batches out of 5 rows"):
        split_to_count(groups, 6)


def test_packing_under_a_dense_mask_kernel_stays_within_a_token_budget():
    """Packed rows under eager or sdpa attention get a dense [N, N] block mask: with no micro_batch_tokens,
    micro-batches are cut at DENSE_MASK_PACK_TOKENS as well as at the row count, so N cannot reach rows x
    the longest row. Flex (block-sparse mask) and flash-attention (row boundaries from position ids) keep
    the row cut alone."""
    from gyre.engines.microbatch import DENSE_MASK_PACK_TOKENS

    assert DENSE_MASK_PACK_TOKENS == 4096
    lengths = torch.tensor([100, 3000, 2000, 1500, 100])  # longest first: 1 (3000), 2, 3, 0, 4
    pack = MemoryLevers(remove_padding="pack")

    def plan(rows, dense):
        return [g.tolist() for g in plan_micro_batches(lengths, rows, pack, dense)]

    assert plan(128, dense=False) == [[1, 2, 3, 0, 4]]  # 6700 tokens in one sequence
    # 3000 + 2000 > 4096: row 1 alone; 2000 + 1500 + 100 + 100 = 3700 fits.
    assert plan(128, dense=True) == [[1], [2, 3, 0, 4]]
    assert plan(2, dense=True) == [[1], [2, 3], [0, 4]]  # and still at most `rows` rows
    assert plan(2, dense=False) == [[1, 2], [3, 0], [4]]
    sort = MemoryLevers(remove_padding="sort")  # padded rows: nothing changes
    assert [g.tolist() for g in plan_micro_batches(lengths, 128, sort, True)] == [[1, 2, 3, 0, 4]]


def test_packed_layout_and_block_mask_hand_computed():
    attention = torch.tensor([[1, 1, 0], [1, 1, 1]])
    layout = RowLayout(attention.sum(dim=1), 3, packed=True)
    assert layout.position_ids(CPU).tolist() == [[0, 1, 0, 1, 2]]
    assert layout.to_model(torch.tensor([[7, 8, 0], [4, 5, 6]])).tolist() == [[7, 8, 4, 5, 6]]
    # Per position, something about the next token; row 0's last (index 1) and row 1's last are dropped.
    assert layout.next_token_to_rows(torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]])).tolist() == [[0, 1, 0], [0, 3, 4]]
    allowed = block_causal_mask(torch.tensor([2, 3]), CPU, "sdpa")[0, 0].int().tolist()
    assert allowed == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 1]]
    additive = block_causal_mask(torch.tensor([2, 3]), CPU, "eager")[0, 0]
    assert additive.dtype == torch.float32 and (additive == 0).int().tolist() == allowed


def _batch():
    """Rows of very different lengths, a one-token padding row, a KL reference and old log-probs."""
    g = torch.Generator().manual_seed(1)
    plens, rlens = (3, 9, 4, 2, 6, 5), (2, 11, 1, 7, 3, 0)
    prompts = [torch.randint(4, 90, (n,), generator=g).tolist() for n in plens]
    responses = [torch.randint(4, 90, (n,), generator=g).tolist() for n in rlens]
    batch = collate(prompts, responses, pad_id=0, advantages=[1.0, -0.5, 0.7, -1.2, 0.3, 0.0],
                    rollout_logprobs=[[-1.5] * len(r) for r in responses])
    batch.attention_mask[5, 1:] = 0  # a padding row as collate_groups writes them: one token, nothing trained
    batch.input_ids[5, 1:] = 0
    batch.ref_logprobs = -2.0 * batch.response_mask
    batch.old_logprobs = -1.4 * batch.response_mask
    return batch


SPEC = PolicyLossSpec(agg="seq-mean-token-mean", kl=KLSpec(loss_coef=0.1), entropy_coef=0.01,
                      temperature=0.8)


def _step(model, batch, levers: MemoryLevers, spec=SPEC, rows=2):
    """The policy's step loss summed over micro-batches, and the gradient."""
    denom = denominator_for(batch.response_mask, norm_length=16)
    return _run(model, batch, levers, PolicyLoss(denom=denom, spec=spec), rows)


def _run(model, batch, levers: MemoryLevers, loss_fn, rows: int):
    """Loss, gradient, metrics and micro-batch count of one step, as TrainerBackend.optimizer_step makes them."""
    model.zero_grad(set_to_none=True)
    fwd, metrics, total = ForwardContext(CPU, levers=levers), MetricSums(), 0.0
    groups = plan_micro_batches(batch.attention_mask.sum(dim=1), rows, levers)
    for micro in micro_batches(batch, groups):
        loss = loss_fn.compute(model, micro, fwd, metrics)
        loss.backward()
        total += float(loss.detach())
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return total, grads, metrics.means(), len(groups)


def _assert_same_step(got, want):
    assert got[0] == pytest.approx(want[0], abs=1e-6)
    assert got[1].keys() == want[1].keys()
    for name in want[1]:
        torch.testing.assert_close(got[1][name], want[1][name], atol=1e-6, rtol=1e-4, msg=name)
    assert got[2].keys() == want[2].keys()
    for name in want[2]:
        assert got[2][name] == pytest.approx(want[2][name], abs=1e-5), name


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def policy_model(request, tiny_model_dir):
    torch.manual_seed(0)
    return load_causal_lm(tiny_model_dir, attn_implementation=request.param).train()


@pytest.fixture(scope="module")
def sdpa_model(tiny_model_dir):
    return load_causal_lm(tiny_model_dir, attn_implementation="sdpa").train()


@pytest.mark.parametrize("lever", list(LEVERS))
def test_each_lever_gives_the_plain_loss_and_gradient(policy_model, lever):
    batch = _batch()
    plain = _step(policy_model, batch, MemoryLevers(), rows=len(batch))
    _assert_same_step(_step(policy_model, batch, LEVERS[lever]), plain)


def test_levers_give_the_plain_per_token_logprobs_and_entropies(policy_model):
    batch = _batch()
    with torch.no_grad():
        lp, ent = sequence_logprobs(policy_model, batch, ForwardContext(CPU), 0.8, entropy=True)
        for levers in LEVERS.values():
            got_lp, got_ent = sequence_logprobs(policy_model, batch, ForwardContext(CPU, levers=levers), 0.8,
                                                entropy=True)
            torch.testing.assert_close(got_lp, lp, atol=1e-5, rtol=0)
            torch.testing.assert_close(got_ent, ent, atol=1e-5, rtol=0)
    real = batch.attention_mask.bool()
    assert (lp[:, 0] == 0).all() and (lp[~real] == 0).all() and (lp[:, 1:][real[:, 1:]] < 0).all()
    assert (ent[batch.response_mask == 0] == 0).all() and (ent[batch.response_mask == 1] > 0).all()


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_token_budget_split_keeps_the_step_loss(sdpa_model, agg):
    """Any split into micro-batches gives the one-pass loss: the global denominators see the whole step."""
    batch, spec = _batch(), PolicyLossSpec(agg=agg, old_source="recomputed")
    whole = _step(sdpa_model, batch, MemoryLevers(), spec, rows=len(batch))
    for budget in (12, 25, 40):
        split = _step(sdpa_model, batch, MemoryLevers(micro_batch_tokens=budget, remove_padding="pack"), spec)
        assert split[3] > 1
        _assert_same_step(split, whole)


def test_gradient_checkpointing_gives_the_same_loss_and_gradient(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir).train()
    calls, mlp = [], model.model.layers[0].mlp
    forward = mlp.forward
    mlp.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)  # (hooks do not run in the recompute)
    batch = _batch()
    plain = _step(model, batch, MemoryLevers(), rows=len(batch))
    assert len(calls) == 1
    enable_activation_checkpointing(model)  # what TrainerBackend does with model.gradient_checkpointing
    _assert_same_step(_step(model, batch, MemoryLevers(), rows=len(batch)), plain)
    assert len(calls) == 3  # the layer ran again in the backward pass: its activations were not kept
    _assert_same_step(_step(model, batch, LEVERS["pack+tokens+chunk"]), plain)


def test_packed_critic_values_loss_and_gradient(tiny_model_dir):
    torch.manual_seed(0)
    critic = load_value_model(tiny_model_dir).train()
    batch = _batch()
    batch.values, batch.returns = 0.1 * batch.response_mask, 0.5 * batch.response_mask

    loss_fn = ValueLoss(denom=denominator_for(batch.response_mask), clip=0.2)
    packed = _run(critic, batch, MemoryLevers(micro_batch_tokens=20, remove_padding="pack"), loss_fn, rows=2)
    assert packed[3] > 1
    _assert_same_step(packed, _run(critic, batch, MemoryLevers(), loss_fn, rows=len(batch)))
    with torch.no_grad():
        plain = sequence_values(critic, batch, ForwardContext(CPU))
        packed = sequence_values(critic, batch, ForwardContext(CPU, levers=MemoryLevers(remove_padding="pack")))
    torch.testing.assert_close(packed, plain, atol=1e-5, rtol=0)


def test_reference_model_with_levers_scores_like_the_plain_one(tiny_model_dir):
    batch = _batch()
    plain = ReferenceModel(str(tiny_model_dir), "float32", CPU).compute_logprobs(batch, 0.8)
    levers = MemoryLevers(micro_batch_tokens=24, remove_padding="pack", logprob_chunk_tokens=5)
    fast = ReferenceModel(str(tiny_model_dir), "float32", CPU, levers=levers).compute_logprobs(batch, 0.8)
    torch.testing.assert_close(fast, plain, atol=1e-5, rtol=0)


def test_chunked_logprobs_refuse_a_model_that_changes_its_logits():
    """Gemma 2 soft-caps its logits after the output layer: chunking would skip that, so it is refused."""
    from transformers import Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM

    small = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=16)
    check_chunkable(LlamaForCausalLM(LlamaConfig(**small)), CPU, "policy.logprob_chunk_tokens")
    gemma = Gemma2ForCausalLM(Gemma2Config(**small, final_logit_softcapping=30.0))
    with pytest.raises(ValueError, match="Gemma2ForCausalLM changes its logits after the output layer.*unset "
                                         "policy.logprob_chunk_tokens"):
        check_chunkable(gemma, CPU, "policy.logprob_chunk_tokens")


def test_levers_with_lora_adapters_give_the_plain_loss_and_gradient(tiny_model_dir):
    """LoRA (peft wraps the model and its layers) under every lever at once: the chunked head must find
    the output layer through the wrapper, packing must reach the adapted attention."""
    pytest.importorskip("peft")
    from gyre.models.lora import apply_lora
    from gyre.models.specs import LoraSpec

    model = load_causal_lm(tiny_model_dir, attn_implementation="sdpa")
    apply_lora(model, LoraSpec(r=4, alpha=8), seed=3)
    with torch.no_grad():  # B starts at 0: move it so the adapters change the log-probs and get A's gradient
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    batch = _batch()
    plain = _step(model.train(), batch, MemoryLevers(), rows=len(batch))
    assert plain[1] and all(".lora_" in n for n in plain[1])
    every = MemoryLevers(micro_batch_tokens=24, remove_padding="pack", logprob_chunk_tokens=5)
    _assert_same_step(_step(model, batch, every), plain)
