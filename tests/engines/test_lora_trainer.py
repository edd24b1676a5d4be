"""LoRA in the trainer backend on real torch.distributed (gloo) processes: only the adapters train, the
engines' merged weights equal peft's merge, the reference is the base model, checkpoints hold the
adapters alone and resume exactly, and the saved models load."""

import os

import pytest
import torch
import torch.multiprocessing as mp

from gyre.algos import LossDenominator
from gyre.engines.losses import PolicyLoss, PolicyLossSpec
from gyre.engines.specs import OptimizerSpec, SchedulerSpec
from gyre.engines.trainer import TrainerBackend, TrainerSpec
from gyre.models.specs import LoraSpec
from gyre.types import MetricSums
from tests.engines.test_trainer import _batch, _free_port

pytest.importorskip("peft")

LORA = LoraSpec(r=4, alpha=8)


def _init(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)


def _trainer(model_dir, lora=LORA, **spec) -> TrainerBackend:
    b = TrainerBackend(TrainerSpec(str(model_dir), micro_batch_size=2, lora=lora, **spec), torch.device("cpu"))
    b.setup()
    b.configure_optimizer(OptimizerSpec(lr=1e-2), SchedulerSpec(type="linear", warmup_steps=2), 10, 1.0)
    return b


def _step(b: TrainerBackend, batch) -> None:
    loss = PolicyLoss(denom=LossDenominator(tokens=float(batch.response_mask.sum())),
                      spec=PolicyLossSpec(old_source="rollout"))
    b.optimizer_step(b.split_micro(batch), loss, MetricSums())


def _weights_worker(rank, model_dir, port):
    import copy

    from gyre.cluster.weights import pack_weights, unpack_weights
    from gyre.engines.forward import ForwardContext, batch_logprobs
    from gyre.engines.hf_rollout import HFRolloutEngine
    from gyre.models.loading import load_causal_lm, load_tokenizer
    from gyre.models.lora import AdapterWeights, lora_targets
    from gyre.types import GenerationRequest, SamplingParams

    _init(0, 1, port)
    batch, cpu = _batch(), torch.device("cpu")
    b = _trainer(model_dir, gradient_checkpointing=True)
    trainable = {n for n, p in b.hf_model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert sum(p.numel() for p in b.hf_model.parameters() if p.requires_grad) == 17408  # tests/models/test_lora.py
    for _ in range(2):
        _step(b, batch)
    # Adapter-only optimizer state: AdamW's step, exp_avg and exp_avg_sq for each of the 28 factors, nothing else.
    adapters = {id(p) for n, p in b.hf_model.named_parameters() if n in trainable}
    assert set(map(id, b.optimizer.state)) == adapters and len(adapters) == 28
    assert sum(len(s) for s in b.optimizer.state.values()) == 3 * 28
    assert all(p.grad is not None for n, p in b.hf_model.named_parameters() if ".lora_A." in n)  # through checkpointing
    # The reference: the base model's log-probs exactly, while the policy's have moved.
    base = load_causal_lm(model_dir)
    reference = b.compute_logprobs(batch, 1.0, adapter=False)
    assert torch.equal(reference, batch_logprobs(base, batch, ForwardContext(cpu), 1.0, [torch.arange(len(batch))]))
    assert not torch.allclose(b.compute_logprobs(batch, 1.0), reference)
    # The weight sync: adapters only, merged by the engine into its base = peft's merge_and_unload, bit for bit.
    targets = lora_targets(b.hf_model)
    bundle = pack_weights(AdapterWeights.from_trainable_state(b.trainable_state_dict(), targets).tensors(), 2,
                          lora=targets)
    assert bundle.nbytes == 17408 * 4
    tokenizer = load_tokenizer(model_dir)
    engine = HFRolloutEngine(base, tokenizer)
    engine.load_adapter(AdapterWeights.from_tensors(unpack_weights(bundle), bundle.lora), bundle.version)
    merged = copy.deepcopy(b.peft_model).merge_and_unload().state_dict()
    served = engine.model.state_dict()
    assert merged.keys() == served.keys() and all(torch.equal(merged[k], served[k]) for k in merged)
    # modules_to_save: the norms train in full and replace the engine's own (their base copies stay aside).
    full = _trainer(model_dir, lora=LoraSpec(r=4, alpha=8, modules_to_save=("norm",)))
    _step(full, batch)
    adapter = AdapterWeights.from_trainable_state(full.trainable_state_dict(), lora_targets(full.hf_model))
    assert sorted(adapter.full) == sorted([f"model.layers.{i}.{n}.weight" for i in (0, 1)
                                           for n in ("input_layernorm", "post_attention_layernorm")]
                                          + ["model.norm.weight"])
    norms_engine = HFRolloutEngine(load_causal_lm(model_dir), tokenizer)
    norms_engine.load_adapter(adapter, 1)
    merged = copy.deepcopy(full.peft_model).merge_and_unload().state_dict()
    assert all(torch.equal(v, norms_engine.model.state_dict()[k]) for k, v in merged.items())
    # Hybrid mode samples with the trainer's own (injected) model: the adapters take part in generation,
    # which samples what the merged engine samples, and not what the base model would.
    request = GenerationRequest("r", batch.input_ids[0, :3].tolist(), SamplingParams(max_new_tokens=5), n=2, seed=3)
    outs = [e.generate([request]) for e in (engine, HFRolloutEngine(b.hf_model, tokenizer),
                                            HFRolloutEngine(load_causal_lm(model_dir), tokenizer))]
    for served_out, hybrid_out, base_out in zip(*outs):
        assert served_out.response_ids == hybrid_out.response_ids
        assert torch.allclose(torch.tensor(served_out.logprobs), torch.tensor(hybrid_out.logprobs), atol=1e-5)
        assert not torch.allclose(torch.tensor(hybrid_out.logprobs[:1]), torch.tensor(base_out.logprobs[:1]))


def test_lora_trains_adapters_only_and_engines_merge_them(tiny_model_dir):
    mp.spawn(_weights_worker, args=(str(tiny_model_dir), _free_port()), nprocs=1, join=True)


def _checkpoint_worker(rank, model_dir, port, out):
    from pathlib import Path

    import torch.distributed.checkpoint as dcp
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from gyre.cluster.workers import PolicyWorker
    from gyre.models.loading import load_causal_lm
    from gyre.models.lora import export_lora, read_marker

    _init(0, 1, port)
    batch, out = _batch(), Path(out)
    a = _trainer(model_dir)
    for _ in range(2):
        _step(a, batch)
    a.save(str(out / "ckpt"))
    saved = dcp.FileSystemReader(str(out / "ckpt")).read_metadata().state_dict_metadata
    weights = [k for k in saved if k.startswith("model.")]
    assert len(weights) == 28 and all(".lora_" in k for k in weights)  # no base weight in the checkpoint
    assert read_marker(out / "ckpt") == LORA
    _step(a, batch)  # the step a resumed run must reproduce
    b = _trainer(model_dir)
    b.load(str(out / "ckpt"))
    _step(b, batch)
    for (name, pa), (_, pb) in zip(a.hf_model.named_parameters(), b.hf_model.named_parameters()):
        assert torch.equal(pa, pb), name
    # The final model: merged (plain transformers) and the adapter (peft), the same weights either way.
    worker = PolicyWorker.__new__(PolicyWorker)  # the actor class, without Ray
    worker.backend = a
    worker.save_hf(str(out / "merged"), model_dir, "float32", str(out / "adapter"))
    merged = AutoModelForCausalLM.from_pretrained(out / "merged").state_dict()
    with_adapter = PeftModel.from_pretrained(load_causal_lm(model_dir), out / "adapter").merge_and_unload()
    assert all(torch.equal(merged[k], v) for k, v in with_adapter.state_dict().items())
    assert (out / "adapter" / "tokenizer_config.json").read_bytes() == (Path(model_dir) / "tokenizer_config.json") \
        .read_bytes()
    # `gyre export` of the checkpoint (saved one step before), as the command runs it: no process group.
    # Merged in bfloat16, or the adapter.
    torch.distributed.destroy_process_group()
    export_lora(out / "ckpt", model_dir, out / "export", dtype="bfloat16")
    exported = AutoModelForCausalLM.from_pretrained(out / "export")
    assert exported.dtype == torch.bfloat16 and not torch.equal(exported.state_dict()["model.layers.0.self_attn.q_proj"
                                                                                    ".weight"].float(),
                                                                merged["model.layers.0.self_attn.q_proj.weight"])
    export_lora(out / "ckpt", model_dir, out / "export-adapter", merge=False)
    assert (out / "export-adapter" / "adapter_config.json").is_file()
    with pytest.raises(ValueError, match="exists and is not empty"):
        export_lora(out / "ckpt", model_dir, out / "export")
    # The same through `gyre export`'s own path: a LoRA checkpoint is merged, or written as the adapter.
    from gyre.app.export import ExportSpec, export_model
    from gyre.app.model_source import ModelSource

    (out / "step").mkdir()  # a run's checkpoint step holds the trainer's save as policy/
    (out / "step" / "policy").symlink_to(out / "ckpt")
    source = ModelSource("checkpoint", out / "step", "step", run_config={"model": {"path": str(model_dir)}})
    export_model(source, ExportSpec(out / "cli", "bfloat16"), echo=lambda s: None)
    assert torch.equal(AutoModelForCausalLM.from_pretrained(out / "cli").state_dict()["model.norm.weight"],
                       exported.state_dict()["model.norm.weight"])
    export_model(source, ExportSpec(out / "cli-adapter", merge_adapter=False), echo=lambda s: None)
    assert (out / "cli-adapter" / "adapter_config.json").is_file()


def test_lora_checkpoints_hold_adapters_resume_exactly_and_save_both_forms(tiny_model_dir, tmp_path):
    mp.spawn(_checkpoint_worker, args=(str(tiny_model_dir), _free_port(), str(tmp_path)), nprocs=1, join=True)


def _fsdp2_worker(rank, model_dir, port):
    import torch.distributed as dist

    from gyre.algos.aggregation import denominator_for
    from gyre.data.batching import split_for_ranks

    _init(rank, 2, port)
    batch = _batch()
    shard = split_for_ranks(batch, 2)[0][rank]
    loss = PolicyLoss(denom=denominator_for(batch.response_mask, 2, norm_length=8),
                      spec=PolicyLossSpec(old_source="rollout"))
    grads, exported = {}, {}
    for strategy in ("ddp", "fsdp2"):
        b = TrainerBackend(TrainerSpec(model_dir, strategy=strategy, micro_batch_size=1, lora=LORA),
                           torch.device("cpu"))
        b.setup()
        b.configure_optimizer(OptimizerSpec(lr=1e-9), SchedulerSpec(), 1, None)
        b.optimizer_step(b.split_micro(shard), loss, MetricSums())
        grads[strategy] = {name.removeprefix("module."): (p.grad.full_tensor() if hasattr(p.grad, "full_tensor")
                                                          else p.grad).clone()
                           for name, p in b.model.named_parameters() if p.grad is not None}
        exported[strategy] = b.trainable_state_dict()  # FSDP2 gathers the adapters' shards
    if rank == 0:
        assert grads["ddp"].keys() == grads["fsdp2"].keys() == exported["fsdp2"].keys() and len(grads["ddp"]) == 28
        for name, g in grads["ddp"].items():
            assert torch.allclose(g, grads["fsdp2"][name], atol=1e-7, rtol=1e-4), name
            assert torch.allclose(exported["ddp"][name], exported["fsdp2"][name], atol=1e-8), name
        assert any(g.abs().max() > 1e-6 for g in grads["ddp"].values())
    dist.destroy_process_group()
    os._exit(0)  # FSDP2 over gloo may abort at interpreter exit (see tests/engines/test_trainer.py)


@pytest.mark.slow  # ~20 s; LoRA's adapter-only training and exact resume run by default (the tests above)
def test_lora_with_fsdp2_gives_the_ddp_gradient(tiny_model_dir):
    """Two gloo ranks: FSDP2 shards base weights and adapters alike, and the adapters (initialised from the
    run's seed on every rank: FSDP2 broadcasts nothing) get DDP's gradients, which are DP=1's."""
    mp.spawn(_fsdp2_worker, args=(str(tiny_model_dir), _free_port()), nprocs=2, join=True)
