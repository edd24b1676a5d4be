"""The trainer backend on real torch.distributed (gloo) processes: DP=2 equals DP=1, checkpoints."""

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from gyre.algos import LossDenominator
from gyre.algos.aggregation import denominator_for
from gyre.data.batching import collate, split_for_ranks
from gyre.engines.losses import PolicyLoss, PolicyLossSpec
from gyre.engines.microbatch import plan_micro_batches
from gyre.engines.specs import MemoryLevers, OptimizerSpec, SchedulerSpec
from gyre.engines.trainer import TrainerBackend, TrainerSpec, lr_lambda
from gyre.types import MetricSums


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _batch():
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 90, (int(n),), generator=g).tolist() for n in (3, 5, 4, 6)]
    responses = [torch.randint(4, 90, (int(n),), generator=g).tolist() for n in (2, 7, 1, 4)]
    return collate(prompts, responses, pad_id=0, advantages=[1.0, -0.5, 0.7, -1.2],
                   rollout_logprobs=[[-1.0] * len(r) for r in responses])


def _grad_worker(rank, world, strategy, model_dir, port, out, device_kind="cpu", agg="token-mean", memory=None):
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device_kind == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if device_kind == "cuda" else "gloo", rank=rank, world_size=world)
    device = torch.device("cuda", rank) if device_kind == "cuda" else torch.device("cpu")
    spec = TrainerSpec(str(model_dir), strategy=strategy, micro_batch_size=1, **(memory or {}))
    backend = TrainerBackend(spec, device)
    backend.setup()
    # FSDP2: only rank 0 reads the weights; the others are built on meta and filled from its shards.
    assert backend.built_on == ("meta" if strategy == "fsdp2" and rank > 0 else "cpu" if strategy == "fsdp2"
                                else str(device)), (strategy, rank, backend.built_on)
    backend.configure_optimizer(OptimizerSpec(lr=1e-9), SchedulerSpec(), 1, grad_clip=None)
    batch = _batch()
    shard = split_for_ranks(batch, world)[0][rank]
    denom = denominator_for(batch.response_mask, world, norm_length=8)
    loss = PolicyLoss(denom=denom, spec=PolicyLossSpec(old_source="rollout", agg=agg))
    norm = backend.optimizer_step(backend.split_micro(shard), loss, MetricSums())
    grads = {}
    for name, p in backend.model.named_parameters():
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        grads[name.removeprefix("module.")] = g.detach().cpu().clone()
    if rank == 0:
        torch.save({"grads": grads, "norm": norm}, out)
    dist.destroy_process_group()
    # Leave without C++ static destructors: with FSDP2 over gloo on CPU (torch 2.13) a background thread
    # still joinable at interpreter exit sometimes aborts the process ("terminate called without an
    # active exception") after all the work is done, which spawn would report as a failure.
    os._exit(0)


def _grads(world, strategy, model_dir, tmp_path, device_kind="cpu", agg="token-mean", memory=None):
    """``memory``: TrainerSpec fields of the memory levers (levers, gradient_checkpointing)."""
    out = tmp_path / f"{strategy}{world}{device_kind}{agg}{bool(memory)}.pt"
    mp.spawn(_grad_worker, args=(world, strategy, model_dir, _free_port(), str(out), device_kind, agg, memory),
             nprocs=world, join=True)
    return torch.load(out)


TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (NCCL)")


@pytest.mark.parametrize("strategy,device_kind", [
    ("ddp", "cpu"), ("fsdp2", "cpu"),
    pytest.param("ddp", "cuda", marks=TWO_GPUS), pytest.param("fsdp2", "cuda", marks=TWO_GPUS),
])
def test_two_ranks_give_the_single_rank_gradient(tiny_model_dir, tmp_path, strategy, device_kind):
    """Global token-mean denominators make the gradient independent of the DP split and micro-batching."""
    single = _grads(1, "ddp", tiny_model_dir, tmp_path, device_kind)
    double = _grads(2, strategy, tiny_model_dir, tmp_path, device_kind)
    assert single["grads"].keys() == double["grads"].keys()
    for name, g in single["grads"].items():
        assert torch.allclose(g, double["grads"][name], atol=1e-5, rtol=1e-4), name
    assert double["norm"] == pytest.approx(single["norm"], rel=1e-4)


@pytest.mark.slow  # ~10-15 s each; the split invariance of token-mean runs by default (the two-rank tests)
@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_sequence_level_aggregation_is_split_invariant_too(tiny_model_dir, tmp_path, agg):
    """Global sequence counts (and the constant length) make the sequence-level modes DP-invariant as well."""
    single = _grads(1, "ddp", tiny_model_dir, tmp_path, agg=agg)
    double = _grads(2, "ddp", tiny_model_dir, tmp_path, agg=agg)
    for name, g in single["grads"].items():
        assert torch.allclose(g, double["grads"][name], atol=1e-5, rtol=1e-4), name


@pytest.fixture(scope="module")
def single_rank(tiny_model_dir, tmp_path_factory):
    """The plain single-rank gradient of ``_batch``."""
    return _grads(1, "ddp", tiny_model_dir, tmp_path_factory.mktemp("single"))


# DDP with the levers also runs end to end in test_hybrid_rollout_samples_with_the_training_weights.
@pytest.mark.parametrize("strategy", [pytest.param("ddp", marks=pytest.mark.slow), "fsdp2"])
def test_memory_levers_keep_the_gradient_on_two_ranks(tiny_model_dir, tmp_path, single_rank, strategy):
    """Packed token-budget micro-batches, chunked log-probs and activation checkpointing through DDP and
    FSDP2. The ranks' shards (12 + 5 and 10 + 5 tokens) make 2 and 1 micro-batches of <= 15 tokens: FSDP2
    ranks must still run as many forward passes, so the second rank splits its one."""
    levers = MemoryLevers(micro_batch_tokens=15, remove_padding="pack", logprob_chunk_tokens=5)
    shards = split_for_ranks(_batch(), 2)[0]
    assert [len(plan_micro_batches(s.attention_mask.sum(dim=1), 1, levers)) for s in shards] == [2, 1]
    single = single_rank
    double = _grads(2, strategy, tiny_model_dir, tmp_path,
                    memory={"levers": levers, "gradient_checkpointing": True})
    for name, g in single["grads"].items():
        assert torch.allclose(g, double["grads"][name], atol=1e-5, rtol=1e-4), name
    assert double["norm"] == pytest.approx(single["norm"], rel=1e-4)


def _ckpt_worker(rank, model_dir, port, directory):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)

    def fresh():
        b = TrainerBackend(TrainerSpec(str(model_dir), micro_batch_size=2), torch.device("cpu"))
        b.setup()
        b.configure_optimizer(OptimizerSpec(lr=1e-2), SchedulerSpec(type="linear", warmup_steps=2), 10, 1.0)
        return b

    batch = _batch()
    denom = LossDenominator(tokens=float(batch.response_mask.sum()))
    loss = PolicyLoss(denom=denom, spec=PolicyLossSpec(old_source="rollout"))
    a = fresh()
    for _ in range(2):
        a.optimizer_step(a.split_micro(batch), loss, MetricSums())
    a.save(directory)
    lr_at_save = a.lr
    a.optimizer_step(a.split_micro(batch), loss, MetricSums())  # the step a resumed run must reproduce
    b = fresh()
    b.load(directory)
    assert b.optimizer_steps == 2 and b.lr == lr_at_save
    b.optimizer_step(b.split_micro(batch), loss, MetricSums())
    for (na, pa), (_, pb) in zip(a.hf_model.named_parameters(), b.hf_model.named_parameters()):
        assert torch.equal(pa, pb), na
    # A checkpoint before the first optimizer step (the run's step-0 recovery point) changes nothing:
    # reading the untouched optimizer's state must not leave Adam's step counter at 1.
    saved, straight, resumed = fresh(), fresh(), fresh()
    saved.save(directory + "-step0")
    resumed.load(directory + "-step0")
    for backend in (saved, straight, resumed):
        backend.optimizer_step(backend.split_micro(batch), loss, MetricSums())
    for (na, pa), (_, pb), (_, pc) in zip(straight.hf_model.named_parameters(), saved.hf_model.named_parameters(),
                                          resumed.hf_model.named_parameters()):
        assert torch.equal(pa, pb) and torch.equal(pa, pc), na
    dist.destroy_process_group()


def test_checkpoint_round_trip_resumes_identically(tiny_model_dir, tmp_path):
    mp.spawn(_ckpt_worker, args=(tiny_model_dir, _free_port(), str(tmp_path / "ckpt")), nprocs=1, join=True)


def test_lr_schedules():
    warm_linear = lr_lambda(SchedulerSpec(type="linear", warmup_steps=2, min_lr_ratio=0.1), total_steps=12)
    # warm-up 1/2, 2/2; then linear from 1.0 at step 2 to 0.1 at step 12
    assert [round(warm_linear(s), 4) for s in (0, 1, 2, 7, 12)] == [0.5, 1.0, 1.0, 0.55, 0.1]
    cosine = lr_lambda(SchedulerSpec(type="cosine"), total_steps=10)
    assert cosine(0) == pytest.approx(1.0) and cosine(5) == pytest.approx(0.5) and cosine(10) == pytest.approx(0.0)
    assert lr_lambda(SchedulerSpec(), 10)(7) == 1.0


def _offload_worker(rank, model_dir, port):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    for strategy in ("ddp", "fsdp2"):
        b = TrainerBackend(TrainerSpec(str(model_dir), dtype="bfloat16", strategy=strategy, micro_batch_size=2),
                           torch.device("cuda", 0))
        b.setup()
        b.configure_optimizer(OptimizerSpec(lr=1e-3), SchedulerSpec(), 10, 1.0)
        batch = _batch()
        loss = PolicyLoss(LossDenominator(tokens=float(batch.response_mask.sum())),
                          PolicyLossSpec(old_source="rollout"))
        b.optimizer_step(b.split_micro(batch), loss, MetricSums())
        before = torch.cuda.memory_allocated()
        b.offload()
        assert torch.cuda.memory_allocated() < before / 4, strategy  # weights, grads and Adam moments left
        b.reload()
        b.optimizer_step(b.split_micro(batch), loss, MetricSums())  # still trains after the round trip
        assert all(torch.isfinite(v).all() for v in b.full_state_dict().values())
        del b
        torch.cuda.empty_cache()
    dist.destroy_process_group()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_offload_frees_the_gpu_and_training_resumes(tiny_model_dir):
    mp.spawn(_offload_worker, args=(tiny_model_dir, _free_port()), nprocs=1, join=True)


def _fp16_worker(rank, model_dir, port):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    for strategy in ("ddp", "fsdp2"):
        b = TrainerBackend(TrainerSpec(str(model_dir), dtype="float16", strategy=strategy, micro_batch_size=2),
                           torch.device("cuda", 0))
        b.setup()
        assert b._scaler is not None, strategy
        b.configure_optimizer(OptimizerSpec(lr=1e-3), SchedulerSpec(), 10, 1.0)
        batch = _batch()
        loss = PolicyLoss(LossDenominator(tokens=float(batch.response_mask.sum())),
                          PolicyLossSpec(old_source="rollout"))
        before = {k: v.clone() for k, v in b.full_state_dict().items()}
        norms = [b.optimizer_step(b.split_micro(batch), loss, MetricSums()) for _ in range(3)]
        after = b.full_state_dict()
        assert all(torch.isfinite(v).all() for v in after.values()), strategy
        assert any(not torch.equal(before[k], after[k]) for k in after), (strategy, norms)  # some step was taken
    dist.destroy_process_group()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_float16_training_scales_its_loss(tiny_model_dir):
    mp.spawn(_fp16_worker, args=(tiny_model_dir, _free_port()), nprocs=1, join=True)
