"""The trainer backend on real torch.distributed (gloo) processes: DP=2 equals DP=1, checkpoints."""

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from gyre.algos import LossDenominator
from gyre.config.schema import OptimizerConfig, SchedulerConfig
from gyre.data.batching import collate, split_for_ranks
from gyre.engines.losses import GRPOLoss, GRPOLossSpec
from gyre.engines.trainer import MetricSums, TrainerBackend, TrainerSpec, lr_lambda


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


def _grad_worker(rank, world, strategy, model_dir, port, out):
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    backend = TrainerBackend(TrainerSpec(str(model_dir), strategy=strategy, micro_batch_size=1), torch.device("cpu"))
    backend.setup()
    backend.configure_optimizer(OptimizerConfig(lr=1e-9), SchedulerConfig(), 1, grad_clip=None)
    batch = _batch()
    shard = split_for_ranks(batch, world)[0][rank]
    denom = LossDenominator(tokens=float(batch.response_mask.sum()), dp_size=world)
    loss = GRPOLoss(denom=denom, spec=GRPOLossSpec(old_source="rollout"))
    norm = backend.optimizer_step(backend.split_micro(shard), loss, MetricSums())
    grads = {}
    for name, p in backend.model.named_parameters():
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        grads[name.removeprefix("module.")] = g.detach().clone()
    if rank == 0:
        torch.save({"grads": grads, "norm": norm}, out)
    dist.destroy_process_group()


def _grads(world, strategy, model_dir, tmp_path):
    out = tmp_path / f"{strategy}{world}.pt"
    mp.spawn(_grad_worker, args=(world, strategy, model_dir, _free_port(), str(out)), nprocs=world, join=True)
    return torch.load(out)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_two_ranks_give_the_single_rank_gradient(tiny_model_dir, tmp_path, strategy):
    """Global token-mean denominators make the gradient independent of the DP split and micro-batching."""
    single = _grads(1, "ddp", tiny_model_dir, tmp_path)
    double = _grads(2, strategy, tiny_model_dir, tmp_path)
    assert single["grads"].keys() == double["grads"].keys()
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
        b.configure_optimizer(OptimizerConfig(lr=1e-2), SchedulerConfig(type="linear", warmup_steps=2), 10, 1.0)
        return b

    batch = _batch()
    denom = LossDenominator(tokens=float(batch.response_mask.sum()))
    loss = GRPOLoss(denom=denom, spec=GRPOLossSpec(old_source="rollout"))
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
    dist.destroy_process_group()


def test_checkpoint_round_trip_resumes_identically(tiny_model_dir, tmp_path):
    mp.spawn(_ckpt_worker, args=(tiny_model_dir, _free_port(), str(tmp_path / "ckpt")), nprocs=1, join=True)


def test_lr_schedules():
    warm_linear = lr_lambda(SchedulerConfig(type="linear", warmup_steps=2, min_lr_ratio=0.1), total_steps=12)
    # warm-up 1/2, 2/2; then linear from 1.0 at step 2 to 0.1 at step 12
    assert [round(warm_linear(s), 4) for s in (0, 1, 2, 7, 12)] == [0.5, 1.0, 1.0, 0.55, 0.1]
    cosine = lr_lambda(SchedulerConfig(type="cosine"), total_steps=10)
    assert cosine(0) == pytest.approx(1.0) and cosine(5) == pytest.approx(0.5) and cosine(10) == pytest.approx(0.0)
    assert lr_lambda(SchedulerConfig(), 10)(7) == 1.0
