"""Each role's peak memory on one device, estimated from the model's shape and the config before anything
starts: ``gyre check`` prints it, and a plan that cannot fit is refused with the numbers that show why.

Estimates from arithmetic, not measurements (allocator slack, CUDA context and fragmentation add a few
GB: ``HEADROOM``). Per device, for the largest rank of each role (P parameters, L layers, hidden size h,
vocabulary V, T tokens in one micro-batch):

- **trainer** (policy, critic): float32 master weights 4P, gradients 4P and AdamW's two moments 8P (LoRA:
  the adapters' share only), divided by the ranks under FSDP2; DDP holds them whole (its gradients are
  views into the all-reduce buckets: no second copy). FSDP2 gathers the layer it computes and prefetches
  the next in the compute dtype: 2 P/L x its bytes. Activations of one micro-batch in the compute dtype:
  17 h values a token a layer (Korthikanti et al. 2022's 34 h bytes in 16 bits, with attention kernels
  that never hold the [T, T] scores); with gradient checkpointing only each layer's input (h values a
  token a layer) plus one layer recomputed. Log-prob logits in float32, twice (logits and their
  gradient): T x V x 8, or a chunk of ``logprob_chunk_tokens`` at a time. The policy's rank 0 also
  stages the weights for a weight channel in ``model.dtype``. Hybrid ranks add an engine's KV cache
  (and under FSDP2 the full copy they sample from, in the compute dtype).
- **rollout engine** (hf): its weights in ``model.dtype``, the KV cache of every row it decodes at once
  (``rollout.max_batch_size``, else every sample a step may give it: the step's samples over the
  engines, times 1 + ceil(alpha) batches in flight) padded to the widest row (prompt + answer), or its
  ``rollout.max_batch_tokens`` budget when smaller, or what ``rollout.gpu_memory_utilization`` of the
  device leaves beside the weights (and a hybrid rank's training state) when smaller, and one step's
  logits. vLLM reserves ``rollout.gpu_memory_utilization`` (``VLLM_SHARE`` when unset)
  of each of its devices whatever the model, unless the weights alone pass it (or the device size is
  unknown): then its weights, split over the ``rollout.tensor_parallel_size`` devices of a
  tensor-parallel engine.
- **reference**, **teacher**: weights in ``model.dtype``, a forward pass's activations (one layer) and the
  log-prob logits.

Roles that share a device add up, unless the plan offloads (then the largest counts: the others wait
in host memory).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gyre.config.backend import compute_dtype
from gyre.config.catalog import ModelShape

GB = 1e9
HEADROOM = 0.9
"""Share of a device's memory the estimate may fill: the rest is the CUDA context, allocator slack and
fragmentation, which the terms above leave out."""
VLLM_SHARE = 0.9
"""The share of its GPU a vLLM engine reserves (vLLM's gpu_memory_utilization, as gyre builds it)."""
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class RoleMemory:
    """One role's estimate on its most loaded device: named terms in bytes."""

    role: str
    terms: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.terms.values())

    def describe(self) -> str:
        """The total and its terms (those above 1% of it), e.g. ``54.5 GB (weights 7.6 GB, ...)``."""
        parts = ", ".join(f"{name} {_size(value)}" for name, value in self.terms.items() if value >= 0.01 * self.total)
        return _size(self.total) + (f" ({parts})" if parts else "")


def _size(nbytes: float) -> str:
    return f"{nbytes / GB:.1f} GB" if nbytes >= 0.1 * GB else f"{nbytes / 1e6:.1f} MB"


@dataclass
class MemoryPlan:
    roles: list[RoleMemory]
    devices: dict[int, float]
    """Estimated peak per device index (bytes)."""
    device_gb: float | None
    """Memory of one device (None: unknown here, no verdict)."""

    def problems(self) -> list[str]:
        """Devices whose estimate passes HEADROOM of the device's memory, each with what is on it."""
        if self.device_gb is None:
            return []
        limit = self.device_gb * GB * HEADROOM
        return [f"device {d}: about {peak / GB:.1f} GB estimated, more than {HEADROOM:.0%} of its "
                f"{self.device_gb:.0f} GB" for d, peak in sorted(self.devices.items()) if peak > limit]


def estimate(cfg, plan, shape: ModelShape, device_gb: float | None) -> MemoryPlan:
    """Every model role's estimate (``cfg``: an RLVRConfig; ``plan``: its RunPlan) and each device's peak."""
    dtype = _BYTES[compute_dtype(cfg.model.dtype, plan.device_kind)]
    compute = dtype if plan.device_kind == "cuda" else 4  # autocast runs only on CUDA
    roles: dict[str, RoleMemory] = {"policy": trainer(cfg.policy, cfg, shape, len(cfg.policy.devices), compute)}
    if plan.weight_transport == "channel":
        roles["policy"].terms["weight channel staging"] = shape.params * dtype
    if not plan.hybrid_rollout:
        roles["rollout"] = engine(cfg, shape, dtype, device_gb)
    else:
        if cfg.policy.strategy == "fsdp2":  # FSDP2 ranks sample from a gathered copy in the compute dtype
            roles["policy"].terms["sampling copy"] = shape.params * compute
        room = _share_room(cfg, device_gb, roles["policy"].total)
        roles["policy"].terms.update(_kv(cfg, shape, compute, len(cfg.policy.devices), room))
    for name in plan.roles:
        if name in ("reference", "teacher"):
            section = cfg.reference if name == "reference" else cfg.teacher
            roles[name] = scorer(name, section, cfg, shape, dtype, compute)
        elif name.startswith("critic"):
            roles[name] = trainer(cfg.critic, cfg, shape, len(cfg.critic.devices), compute, name)
    devices: dict[int, float] = {}
    for name, memory in roles.items():
        for device in plan.roles.get(name, ()):
            if plan.offload:
                devices[device] = max(devices.get(device, 0.0), memory.total)
            else:
                devices[device] = devices.get(device, 0.0) + memory.total
    return MemoryPlan(list(roles.values()), devices, device_gb)


def _context(cfg) -> int:
    """The longest sample: prompt + answer, or an episode's context (env.context_tokens)."""
    if cfg.env is not None:
        return cfg.env.context_tokens
    return cfg.data.max_prompt_tokens + cfg.rollout.sampling.max_new_tokens


def _tokens(section, cfg) -> int:
    """Tokens of one micro-batch: the token budget, or rows x the longest sample."""
    levers = section.levers
    if levers.micro_batch_tokens:
        return levers.micro_batch_tokens
    return section.micro_batch_size * _context(cfg)


def _logits(section, cfg, shape: ModelShape, tokens: int, training: bool) -> float:
    chunk = section.levers.logprob_chunk_tokens
    return min(tokens, chunk or tokens) * shape.vocab * 4 * (2 if training else 1)


def trainer(section, cfg, shape: ModelShape, ranks: int, compute: int, role: str = "policy") -> RoleMemory:
    """A trainer rank (policy or critic section): weights, gradients, optimizer, activations, logits."""
    fsdp = section.strategy == "fsdp2"
    shard = ranks if fsdp else 1
    lora = getattr(section, "lora", None)
    trained = shape.params * _lora_share(lora, shape) if lora is not None else shape.params
    memory = RoleMemory(role, {"weights": shape.params * 4 / shard, "gradients": trained * 4 / shard,
                               "optimizer": trained * 8 / shard})
    if fsdp:
        memory.terms["gathered layers"] = 2 * shape.params / shape.layers * compute
    tokens, h, layers = _tokens(section, cfg), shape.hidden_size, shape.layers
    # 17 h values a token a layer; checkpointing keeps each layer's input (h) and recomputes one layer.
    saved = layers + 17 if cfg.model.gradient_checkpointing else 17 * layers
    memory.terms["activations"] = tokens * h * saved * compute
    if role == "policy":
        memory.terms["logits"] = _logits(section, cfg, shape, tokens, training=True)
    return memory


def _lora_share(lora, shape: ModelShape) -> float:
    """The adapters' parameters as a share of the model's: rank r on each targeted h x h-ish matrix."""
    targets = len(lora.target_modules) if isinstance(lora.target_modules, (list, tuple)) else 7
    return min(1.0, targets * shape.layers * 2 * lora.r * shape.hidden_size / shape.params)


def _rows(cfg, engines: int) -> int:
    r = cfg.rollout
    if r.max_batch_size:
        return r.max_batch_size
    in_flight = 1 + math.ceil(r.async_ratio)
    return math.ceil(r.prompts_per_step * r.samples_per_prompt / engines) * in_flight


def _share_room(cfg, device_gb: float | None, held: float) -> float | None:
    """Bytes of KV cache the HF engine's gpu_memory_utilization leaves beside ``held`` (None: no such budget)."""
    share = cfg.rollout.gpu_memory_utilization
    return None if share is None or not device_gb else max(0.0, share * device_gb * GB - held)


def _kv(cfg, shape: ModelShape, dtype: int, engines: int, room: float | None = None) -> dict[str, float]:
    rows = _rows(cfg, engines)
    tokens = rows * _context(cfg)
    per_token = shape.kv_bytes_per_token / 2 * dtype
    budgets = [cfg.rollout.max_batch_tokens or tokens, room // per_token if room is not None else tokens]
    # The engine admits rows within its KV budget (a row alone always runs).
    tokens = min(tokens, max(min(budgets), _context(cfg)))
    kv = tokens * per_token
    return {"KV cache": kv, "decode logits": rows * shape.vocab * 4}


def engine(cfg, shape: ModelShape, dtype: int, device_gb: float | None) -> RoleMemory:
    """A rollout engine: vLLM's reservation, or the HF engine's weights, KV cache and logits."""
    r = cfg.rollout
    if r.backend == "vllm":
        # A tensor-parallel engine splits its weights (and its KV cache) over its tp devices.
        tp = r.tensor_parallel_size
        weights = shape.params * dtype / tp
        share = r.gpu_memory_utilization or VLLM_SHARE
        reserved = share * device_gb * GB if device_gb else 0.0
        if weights <= reserved:
            return RoleMemory("rollout", {f"vLLM reservation ({share:.0%})": reserved})
        # Unknown device size, or weights that overflow vLLM's share (vLLM would fail to start): the weights.
        return RoleMemory("rollout", {"weights" + (f" (1/{tp} per device)" if tp > 1 else ""): weights})
    # The HF engine holds one device (tensor parallelism is vLLM's: the config refuses it here).
    weights = shape.params * dtype
    room = _share_room(cfg, device_gb, weights)
    return RoleMemory("rollout", {"weights": weights, **_kv(cfg, shape, dtype, len(r.devices), room)})


def scorer(role: str, section, cfg, shape: ModelShape, dtype: int, compute: int) -> RoleMemory:
    """A frozen model that scores batches (reference, teacher): weights, one layer's activations, logits."""
    tokens = _tokens(section, cfg)
    return RoleMemory(role, {"weights": shape.params * dtype, "activations": tokens * shape.hidden_size * 17 * compute,
                             "logits": _logits(section, cfg, shape, tokens, training=False)})
