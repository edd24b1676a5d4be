"""Trainer backend: one data-parallel rank of the policy, the critic or an SFT model; DDP or FSDP2.

It owns the model, the optimizer and the LR schedule, runs forward passes for log-probs, and applies
the policy loss over micro-batches with global denominators (``gyre.algos.aggregation``). The Ray
actor (``gyre.cluster.workers.PolicyWorker``) holds one of these; nothing here knows about Ray.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

from gyre.engines import memory
from gyre.engines.forward import ForwardContext, batch_logprobs, batch_values, micro_batches
from gyre.engines.logit_head import check_chunkable
from gyre.engines.microbatch import plan_micro_batches, split_to_count
from gyre.engines.pack_attention import role_attention
from gyre.engines.packing import takes_dense_pack_mask
from gyre.engines.specs import MemoryLevers, OptimizerSpec, SchedulerSpec
from gyre.models.loading import load_causal_lm, load_value_model
from gyre.models.specs import LoraSpec
from gyre.types import MetricSums, TrainBatch


@dataclass(frozen=True)
class TrainerSpec:
    model_path: str
    dtype: str = "float32"
    trust_remote_code: bool = False
    gradient_checkpointing: bool = False
    strategy: Literal["ddp", "fsdp2"] = "ddp"
    micro_batch_size: int = 8
    head: Literal["lm", "value"] = "lm"
    """lm: the policy (a causal LM); value: a critic (the backbone with a scalar value head)."""
    attn_implementation: str | None = None
    """transformers' attention kernel (model.attn_implementation); None: gyre's choice for packed
    micro-batches on GPUs, else transformers' (``gyre.engines.pack_attention.packing_attention``)."""
    lora: LoraSpec | None = None
    """Train LoRA adapters only (policy.lora; ``gyre.models.lora``); None trains every weight."""
    seed: int = 0
    """The run's seed: the LoRA adapters' initial values (the same on every rank)."""
    levers: MemoryLevers = MemoryLevers()
    """Micro-batches by token budget, padding removal or packing, chunked log-probs (the role's config)."""
    samples: bool = False
    """The model also generates (the policy under a hybrid rollout): it weighs in the attention choice."""


def lr_lambda(spec: SchedulerSpec, total_steps: int) -> Callable[[int], float]:
    """Multiplier of the peak LR at optimizer step ``s``: linear warm-up, then constant/linear/cosine."""

    def factor(step: int) -> float:
        if spec.warmup_steps and step < spec.warmup_steps:
            return (step + 1) / spec.warmup_steps
        if spec.type == "constant":
            return 1.0
        span = max(1, total_steps - spec.warmup_steps)
        progress = min(1.0, (step - spec.warmup_steps) / span)
        shape = 1.0 - progress if spec.type == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return spec.min_lr_ratio + (1.0 - spec.min_lr_ratio) * shape

    return factor


class TrainerBackend:
    """One rank of a data-parallel trainer. ``torch.distributed`` must be initialised before ``setup``."""

    def __init__(self, spec: TrainerSpec, device: torch.device):
        self.spec = spec
        self.device = device
        self.model: torch.nn.Module | None = None
        self.peft_model = None
        """With LoRA: peft's wrapper around ``hf_model`` (its ``disable_adapter()`` gives the base model)."""
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        self.optimizer_steps = 0
        self.last_lr = 0.0
        self.grad_clip: float | None = None
        self._autocast_dtype = None if spec.dtype == "float32" or device.type != "cuda" else getattr(torch, spec.dtype)
        self.fwd = ForwardContext(device, self._autocast_dtype, spec.levers)
        self._scaler = None
        """float16 compute (on GPUs) scales the loss so small gradients do not underflow (``setup``)."""

    # ---- construction -------------------------------------------------------------------
    def setup(self) -> None:
        # Master weights stay in float32; bf16/fp16 are used for the compute via autocast / FSDP2 policy.
        # FSDP2: rank 0 reads the weights into host memory and moves each shard to its device as it shards;
        # the other ranks build the model on the meta device (nothing read, no memory) and take their
        # shards from rank 0, so a node holds one host copy of the model, not one per GPU. DDP keeps a
        # full replica per rank anyway.
        fsdp = self.spec.strategy == "fsdp2"
        load_on = ("cpu" if dist.get_rank() == 0 else "meta") if fsdp else str(self.device)
        self.built_on = load_on
        """Where this rank built the model: its device or cpu (the weights read), or meta (FSDP2's other ranks)."""
        load = load_causal_lm if self.spec.head == "lm" else load_value_model
        attention = role_attention(self.spec.attn_implementation, self.device.type, self.spec.levers.pack,
                                   self.spec.samples)
        model = load(self.spec.model_path, "float32", self.spec.trust_remote_code, load_on, attention)
        if self.spec.gradient_checkpointing:
            memory.enable_activation_checkpointing(model)
        if self.spec.lora is not None:
            from gyre.models.lora import apply_lora

            # In place: ``model`` keeps its class and names, its targeted layers gain adapters, the rest freezes.
            self.peft_model = apply_lora(model, self.spec.lora, self.spec.gradient_checkpointing, self.spec.seed)
        model.train()
        self.hf_model = model
        full = model.state_dict() if fsdp and load_on != "meta" else None  # rank 0's, before sharding
        self.model = self._wrap(model)
        if fsdp:
            self._fill_from_rank0(full)
            del full
        if self._autocast_dtype is torch.float16:
            # FSDP2's gradients are shards: its scaler agrees on a skipped step across the ranks.
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            self._scaler = ShardedGradScaler() if self.spec.strategy == "fsdp2" else torch.amp.GradScaler("cuda")
        if self.spec.head == "lm" and self.spec.levers.logprob_chunk_tokens:
            check_chunkable(self.model, self.device, "policy.logprob_chunk_tokens")

    @property
    def compute_dtype(self) -> torch.dtype | None:
        """The dtype forward passes compute in under autocast (GPUs, model.dtype below float32); else None."""
        return self._autocast_dtype

    def _fill_from_rank0(self, full: dict | None) -> None:
        """FSDP2: every rank's shards (and buffers) from rank 0's weights (``full``, None on the others)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        if full is None:  # built on meta: room for the shards first (their values arrive next)
            self.model.to_empty(device=self.device)
        set_model_state_dict(self.model, full or {},
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        with torch.no_grad():
            for buffer in self.model.buffers():  # non-persistent ones (rotary frequencies) are in no state dict
                dist.broadcast(buffer, 0)

    def configure_optimizer(self, opt: OptimizerSpec, schedule: SchedulerSpec, total_steps: int,
                            grad_clip: float | None) -> None:
        """A fresh AdamW and LR schedule (e.g. RL after an SFT warm-up starts its own)."""
        fused = self.device.type == "cuda"
        # Frozen parameters (everything but the adapters, with LoRA) get no optimizer state.
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=opt.lr, betas=opt.betas, eps=opt.eps,
                                           weight_decay=opt.weight_decay, fused=fused)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(schedule, total_steps))
        self.grad_clip = grad_clip
        self.optimizer_steps = 0

    def _wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.spec.strategy == "fsdp2":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            mesh = init_device_mesh(self.device.type, (dist.get_world_size(),))
            mp = MixedPrecisionPolicy(param_dtype=self._autocast_dtype or torch.float32, reduce_dtype=torch.float32)
            for layer in _decoder_layers(model):
                fully_shard(layer, mesh=mesh, mp_policy=mp)
            fully_shard(model, mesh=mesh, mp_policy=mp)
            return model
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        # Gradients as views into the all-reduce buckets: one copy of the gradients instead of two.
        return DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=True)

    # ---- forward passes -----------------------------------------------------------------
    def compute_logprobs(self, batch: TrainBatch, temperature: float, adapter: bool = True) -> torch.Tensor:
        """Log-probs of ``batch`` under the current weights, [B, L] on CPU. ``adapter=False`` (LoRA only):
        under the base model, the adapters switched off: the KL reference without a second copy."""
        if not adapter and self.peft_model is None:
            raise RuntimeError("base-model log-probs need LoRA (policy.lora): without it the reference is a role")
        self.model.eval()
        try:
            with self.peft_model.disable_adapter() if not adapter else contextlib.nullcontext():
                return batch_logprobs(self.model, batch, self.fwd, temperature, self._plan(batch))
        finally:
            self.model.train()

    def compute_credit_scales(self, batch: TrainBatch, spec, temperature: float) -> torch.Tensor:
        """Attention-based credit's token scales of ``batch`` under the current weights (``spec``: a
        ``CreditSpec``; an extra eager-attention forward, ``gyre.engines.attention``), [B, L] on CPU."""
        from gyre.engines.attention import attention_credit_scales

        self.model.eval()
        try:
            return attention_credit_scales(self.hf_model, batch, self.fwd, spec, temperature, self._plan(batch))
        finally:
            self.model.train()

    def compute_values(self, batch: TrainBatch) -> torch.Tensor:
        """Critic values of ``batch`` under the current weights, [B, L] on CPU."""
        self.model.eval()
        try:
            return batch_values(self.model, batch, self.fwd, self._plan(batch))
        finally:
            self.model.train()

    # ---- optimisation -------------------------------------------------------------------
    def optimizer_step(self, micro_batches: list[TrainBatch], loss_fn: Callable, metrics: MetricSums) -> float:
        """Accumulate gradients of ``loss_fn`` over ``micro_batches``, then clip and step once.

        ``loss_fn.compute(model, micro, fwd, metrics) -> loss`` runs the forward pass
        the loss needs (log-probs, values) and returns this micro-batch's share of the step loss, already
        scaled by the global denominator. Returns the pre-clip gradient norm.
        """
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        for i, micro in enumerate(micro_batches):
            last = i == len(micro_batches) - 1
            with self._no_sync(not last):
                loss = loss_fn.compute(self.model, micro, self.fwd, metrics)
                (loss if self._scaler is None else self._scaler.scale(loss)).backward()
        if self._scaler is not None:
            self._scaler.unscale_(self.optimizer)  # the norm and the clip see the true gradients
        grad_norm = self._clip_grad()
        self.last_lr = self.lr  # the rate this step uses; the scheduler moves on below
        if self._scaler is None:
            self.optimizer.step()
        else:  # skipped when a gradient overflowed (the scale then halves)
            self._scaler.step(self.optimizer)
            self._scaler.update()
        self.scheduler.step()
        self.optimizer_steps += 1
        return grad_norm

    def _no_sync(self, skip_sync: bool):
        # DDP all-reduces once, after the last micro-batch. FSDP2 reduce-scatters after every micro-batch
        # instead: skipping that would keep a full unsharded gradient on every rank, which is what FSDP
        # is there to avoid.
        if not skip_sync or self.spec.strategy == "fsdp2":
            return contextlib.nullcontext()
        return self.model.no_sync()

    def _clip_grad(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.grad_clip if self.grad_clip is not None else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        return float(norm)

    @property
    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    def split_micro(self, batch: TrainBatch, size: int | None = None) -> list[TrainBatch]:
        """``batch`` cut into micro-batches of at most ``size`` rows (default: the spec's), or by the
        levers' token budget when it is set."""
        return micro_batches(batch, self._plan(batch, size))

    def _plan(self, batch: TrainBatch, size: int | None = None) -> list[torch.Tensor]:
        groups = plan_micro_batches(batch.attention_mask.sum(dim=1), size or self.spec.micro_batch_size,
                                    self.spec.levers, takes_dense_pack_mask(self.model))
        if self.spec.strategy == "fsdp2" and dist.get_world_size() > 1:
            # FSDP2 gathers each layer's shards in every forward pass: all ranks must run as many passes,
            # whatever their token counts. (DDP only synchronises once per optimizer step.)
            count = torch.tensor([len(groups)], device=self.device)
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
            groups = split_to_count(groups, int(count))
        return groups

    # ---- weights, checkpoints, memory -----------------------------------------------------
    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Unsharded HF-named weights on CPU, on rank 0 (None elsewhere). Every rank must call it:
        under FSDP2 it gathers the shards."""
        if self.spec.strategy == "fsdp2":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            return state if dist.get_rank() == 0 else None
        if dist.get_rank() != 0:  # DDP replicas are identical: only rank 0 copies
            return None
        return {k: v.detach().cpu() for k, v in self.hf_model.state_dict().items()}

    def stream_state_dict(self, dtype: torch.dtype, every_rank: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """Unsharded HF-named weights on this rank's device, floating ones cast to ``dtype``, one tensor at a
        time (a weight channel stages them into buckets as they come, so the whole model is never gathered
        at once). Only rank 0 yields, unless ``every_rank``; under FSDP2 every rank must exhaust the iterator
        (each tensor is gathered as it is reached)."""
        yields = every_rank or dist.get_rank() == 0
        if self.spec.strategy != "fsdp2" and not yields:
            return
        with torch.no_grad():
            for name, t in self.hf_model.state_dict().items():
                t = t.detach()
                if hasattr(t, "full_tensor"):
                    t = t.full_tensor()
                if yields:
                    yield name, t.to(dtype) if t.is_floating_point() else t

    def sampling_copy(self) -> torch.nn.Module:
        """An unsharded copy of the model in the compute dtype on this rank's device, for a hybrid FSDP2
        rank to sample from: decoding from the shards would all-gather every layer for every token, and
        the ranks decode different requests at their own pace. Built empty (no file read) and filled by
        ``refresh_sampling_copy``: a collective every rank calls together."""
        dtype = self.compute_dtype or torch.float32
        copy = load_causal_lm(self.spec.model_path, str(dtype).removeprefix("torch."), self.spec.trust_remote_code,
                              "meta", role_attention(self.spec.attn_implementation, self.device.type, False, True))
        copy = copy.to_empty(device=self.device).eval()
        self.refresh_sampling_copy(copy)
        return copy

    def refresh_sampling_copy(self, copy: torch.nn.Module) -> None:
        """``copy`` takes the current weights, each tensor gathered from its shards as it is reached (the whole
        float32 model is never gathered at once), and the buffers (rotary tables, which no state dict holds)."""
        target = copy.state_dict(keep_vars=True)
        with torch.no_grad():
            for name, t in self.stream_state_dict(self.compute_dtype or torch.float32, every_rank=True):
                target[name].copy_(t)
            buffers = dict(copy.named_buffers())
            for name, b in self.hf_model.named_buffers():
                buffers[name].copy_(b)

    def trainable_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The trainable parameters alone (with LoRA: the adapters and modules_to_save), unsharded on CPU,
        on rank 0 (None elsewhere). Every rank must call it: under FSDP2 it gathers these and nothing else
        (DCP's state-dict helpers would also gather a frozen output head tied to the embeddings)."""
        state = {}
        for name, p in self.hf_model.named_parameters():  # the same order on every rank
            if p.requires_grad:
                t = p.detach()
                state[name] = (t.full_tensor() if hasattr(t, "full_tensor") else t).cpu()
        return state if dist.get_rank() == 0 else None

    def _trainable_names(self) -> set[str]:
        return {name for name, p in self.hf_model.named_parameters() if p.requires_grad}

    def _checkpoint_state(self) -> dict:
        """What a checkpoint holds: model and optimizer state (DCP). With LoRA the model part is the
        trainable parameters only: the frozen base is the model directory the run started from."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        if self.peft_model is not None:
            names = self._trainable_names()
            model_sd = {k: v for k, v in model_sd.items() if k in names}
        return {"model": model_sd, "optim": optim_sd}

    def save(self, directory: str) -> None:
        """Model + optimizer (DCP, sharded per rank) and this rank's LR schedule. Collective."""
        import torch.distributed.checkpoint as dcp

        dcp.save(self._checkpoint_state(), checkpoint_id=directory)
        if self.peft_model is not None and dist.get_rank() == 0:
            from gyre.models.lora import write_marker

            write_marker(directory, self.spec.lora)
        if self.optimizer_steps == 0:
            self._fresh_optimizer_state()
        extra = {"scheduler": self.scheduler.state_dict(), "optimizer_steps": self.optimizer_steps,
                 "torch_rng": torch.get_rng_state()}
        if self.device.type == "cuda":
            extra["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        torch.save(extra, f"{directory}/trainer_rank{dist.get_rank()}.pt")

    def load(self, directory: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        state = self._checkpoint_state()
        dcp.load(state, checkpoint_id=directory)
        # strict=False with LoRA: the frozen base weights are not in an adapter-only checkpoint.
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=StateDictOptions(strict=self.peft_model is None))
        extra = torch.load(f"{directory}/trainer_rank{dist.get_rank()}.pt", weights_only=False)
        self.scheduler.load_state_dict(extra["scheduler"])
        self.optimizer_steps = extra["optimizer_steps"]
        if self.optimizer_steps == 0:
            self._fresh_optimizer_state()
        torch.set_rng_state(extra["torch_rng"])
        if "cuda_rng" in extra:
            torch.cuda.set_rng_state(extra["cuda_rng"], self.device)

    def _fresh_optimizer_state(self) -> None:
        """Undo what reading an untouched optimizer's state does: DCP materialises the state with a
        zero-gradient step (Adam's step counter becomes 1), which would shift every later bias
        correction. Before the first real step the optimizer must have no state and no gradients."""
        self.optimizer.state.clear()
        self.optimizer.zero_grad(set_to_none=True)

    def offload(self) -> None:
        """Move parameters and optimizer state to host memory and free gradients while a colocated
        role runs (the wrapped module is moved in place: FSDP2 keeps its own references). DDP's wrapper
        is dropped as well: its reducer holds the gradient buckets (the gradients are views into them) on
        the device whatever becomes of the module; ``reload`` wraps the module again (a collective: every
        rank of the role reloads together, as the time-share activates a role)."""
        memory.offload(self.model, self.device, self.optimizer)
        if self.device.type == "cuda" and self.spec.strategy == "ddp":
            self.model = self.hf_model
            torch.cuda.empty_cache()

    def reload(self) -> None:
        memory.reload(self.model, self.device, self.optimizer)
        if self.spec.strategy == "ddp" and self.model is self.hf_model:  # unwrapped by ``offload``
            self.model = self._wrap(self.hf_model)


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Transformer blocks to shard one by one (the ``layers`` ModuleList of HF decoder models)."""
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 0:
            return list(module)
    return []
