"""The DPO loss on the trainer backend: hand-made log-probs, and the same step whatever the micro-batches
or ranks (real torch.distributed gloo processes, a tiny model)."""

import math
import os

import pytest
import torch
import torch.multiprocessing as mp

from gyre.algos import LossDenominator
from gyre.algos.preference import PreferenceLossSpec
from gyre.data.preference import PreferencePair, preference_batch
from gyre.data.sft import SFTExample
from gyre.engines.forward import ForwardContext
from gyre.engines.losses import DPOLoss
from gyre.engines.specs import MemoryLevers, OptimizerSpec, SchedulerSpec
from gyre.engines.trainer import TrainerBackend, TrainerSpec
from gyre.types import MetricSums
from tests.engines.test_trainer import _free_port


def example(prompt: int, completion: int, seed: int) -> SFTExample:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 90, (prompt + completion,), generator=g).tolist()
    return SFTExample(f"e{seed}", ids, [0] * prompt + [1] * completion)


def test_dpo_loss_on_hand_made_logprobs():
    # Pair 0: chosen 2 completion tokens, rejected 3; pair 1: 1 and 1. Prompts of 2 tokens.
    pairs = [PreferencePair("a", example(2, 2, 0), example(2, 3, 1), -5.0, -5.0),
             PreferencePair("b", example(2, 1, 2), example(2, 1, 3), -1.0, -1.0)]
    batch = preference_batch(pairs, pad_id=0)
    lp = torch.full(batch.rows.input_ids.shape, -9.0)  # off the completions: must not count
    lp[0, 2:4] = torch.tensor([-1.5, -2.5])  # chosen 0: sum -4
    lp[1, 2:5] = -2.0  # rejected 0: sum -6
    lp[2, 2] = lp[3, 2] = -1.0  # pair 1: equal to the reference
    metrics = MetricSums()
    # The step has 4 pairs over 2 ranks: this rank's 2 pairs contribute sum * dp_size / pairs.
    loss = DPOLoss(LossDenominator(tokens=7.0, sequences=4.0, dp_size=2), PreferenceLossSpec(beta=0.5))(
        batch, lp, metrics)
    dpo0 = math.log1p(math.exp(-1.0))  # h = (-4 + 6) - (-5 + 5) = 2; -log sigmoid(0.5 * 2) = 0.3132617
    dpo1 = math.log(2.0)  # h = 0
    assert loss.item() == pytest.approx((dpo0 + dpo1) * 2 / 4, abs=1e-6)  # 0.5032044
    means = metrics.means()
    assert means["dpo_loss"] == pytest.approx((dpo0 + dpo1) / 2, abs=1e-6)
    # Rewards: pair 0 chosen 0.5 * (-4 + 5) = 0.5, rejected 0.5 * (-6 + 5) = -0.5; pair 1 both 0.
    assert means["rewards/chosen"] == pytest.approx(0.25) and means["rewards/rejected"] == pytest.approx(-0.25)
    assert means["rewards/accuracies"] == 0.5 and means["rewards/margins"] == pytest.approx(0.5)
    assert means["logps/chosen"] == pytest.approx(-2.5) and means["logps/rejected"] == pytest.approx(-3.5)
    assert "nll_loss" not in means


def _pairs() -> list[PreferencePair]:
    shapes = [(3, 2, 4), (5, 1, 3), (2, 6, 2), (4, 3, 3)]  # prompt, chosen and rejected completion lengths
    return [PreferencePair(f"p{i}", example(p, c, 10 * i), example(p, r, 10 * i + 1), -3.0 - i, -2.0 + 0.5 * i)
            for i, (p, c, r) in enumerate(shapes)]


def _dpo_worker(rank, world, model_dir, port, out, spec):
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    backend = TrainerBackend(TrainerSpec(str(model_dir)), torch.device("cpu"))
    backend.setup()
    backend.configure_optimizer(OptimizerSpec(lr=1e-3), SchedulerSpec(), 1, grad_clip=None)
    batch = preference_batch(_pairs(), pad_id=0)
    denom = LossDenominator(tokens=float(batch.rows.response_mask.sum()), sequences=float(len(batch)), dp_size=world)
    metrics = MetricSums()
    norm = backend.optimizer_step(batch.split(world)[rank].micro_batches(1), DPOLoss(denom, spec), metrics)
    grads = {n.removeprefix("module."): p.grad.detach().clone() for n, p in backend.model.named_parameters()}
    torch.save({"grads": grads, "norm": norm, "metrics": metrics}, f"{out}.{rank}")
    dist.destroy_process_group()
    os._exit(0)


def _single_process(model_dir, micro_pairs, spec, levers=None):
    """Gradient and metrics of the whole step on one process, ``micro_pairs`` pairs per forward pass."""
    from gyre.models.loading import load_causal_lm

    model = load_causal_lm(str(model_dir))
    batch = preference_batch(_pairs(), pad_id=0)
    loss_fn = DPOLoss(LossDenominator(tokens=1.0, sequences=float(len(batch))), spec)
    metrics = MetricSums()
    for micro in batch.micro_batches(micro_pairs):
        loss_fn.compute(model, micro, ForwardContext(torch.device("cpu"), levers=levers or MemoryLevers()),
                        metrics).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()]))
    return {"grads": grads, "norm": float(norm), "metrics": metrics.means()}


def test_one_or_two_micro_batches_and_ranks_give_the_same_step(tiny_model_dir, tmp_path):
    """Four pairs: one process with one micro-batch of 4 pairs or 4 of one pair, and two DDP ranks of 2 pairs
    each in micro-batches of one: the same loss, metrics and gradient (the denominator is the step's pairs)."""
    spec = PreferenceLossSpec(beta=0.5, rpo_alpha=0.1)
    whole, singles = (_single_process(tiny_model_dir, size, spec) for size in (4, 1))
    out = tmp_path / "dpo"
    mp.spawn(_dpo_worker, args=(2, tiny_model_dir, _free_port(), str(out), spec), nprocs=2, join=True)
    ranks = [torch.load(f"{out}.{r}", weights_only=False) for r in range(2)]
    two_ranks = {**ranks[0], "metrics": ranks[0]["metrics"].merge(ranks[1]["metrics"]).means()}
    assert whole["metrics"]["dpo_loss"] > 0 and set(whole["metrics"]) >= {"rewards/accuracies", "nll_loss"}
    for other in (singles, two_ranks):
        assert other["norm"] == pytest.approx(whole["norm"], rel=1e-4)
        for name, value in whole["metrics"].items():
            assert other["metrics"][name] == pytest.approx(value, rel=1e-5, abs=1e-7), name
        for name, grad in whole["grads"].items():
            torch.testing.assert_close(other["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_memory_levers_give_the_plain_step(tiny_model_dir):
    """policy.remove_padding=pack and logprob_chunk_tokens (gyre dpo's policy section): each micro-batch's
    pairs packed into one sequence, log-probs in chunks of 5 tokens; the same loss, metrics and gradient."""
    spec = PreferenceLossSpec(beta=0.5)
    plain = _single_process(tiny_model_dir, 2, spec)
    levered = _single_process(tiny_model_dir, 2, spec, MemoryLevers(remove_padding="pack", logprob_chunk_tokens=5))
    for name, value in plain["metrics"].items():
        assert levered["metrics"][name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
    for name, grad in plain["grads"].items():
        torch.testing.assert_close(levered["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_reference_logprobs_are_each_completions_summed_logprobs(tiny_model_dir):
    """Two reference ranks, 5 pairs in calls of 2 pairs per rank: the short calls are filled, every pair gets
    the log-probs that one forward pass over it gives, summed over its completion tokens."""
    from gyre.cluster.group import RoleGroup
    from gyre.cluster.workers import ReferenceWorker
    from gyre.models.loading import load_causal_lm
    from gyre.pipelines.dpo import reference_logprobs

    pairs = _pairs() + [PreferencePair("p4", example(3, 2, 90), example(3, 4, 91))]
    args = [(r, str(tiny_model_dir), "float32", False, "cpu", 1, 3) for r in range(2)]
    group = RoleGroup.local("reference", ReferenceWorker, args)
    try:
        reference_logprobs(pairs, group, ReferenceWorker.compute_logprobs, pad_id=0, chunk_pairs=2)
    finally:
        group.kill()
    model = load_causal_lm(str(tiny_model_dir))
    for pair in pairs:
        for seq, got in ((pair.chosen, pair.ref_chosen), (pair.rejected, pair.ref_rejected)):
            ids = torch.tensor([seq.input_ids])
            with torch.no_grad():
                logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
            token_lp = logp.gather(1, ids[0, 1:, None])[:, 0]
            expected = float((token_lp * torch.tensor(seq.loss_mask[1:], dtype=torch.float32)).sum())
            assert got == pytest.approx(expected, abs=1e-4), pair.uid
