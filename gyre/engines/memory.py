"""Offload and reload of a role's device state, for roles that time-share a GPU.

On CPU there is nothing to free, so both are no-ops there. Gradients are dropped rather than moved:
the next backward pass recreates them.
"""

from __future__ import annotations

import torch


def offload(module: torch.nn.Module, device: torch.device, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Move parameters, buffers and optimizer state to host memory, drop gradients, release the cache.
    Plain tensors land in pinned (page-locked) host memory, from which ``reload`` copies back
    asynchronously at full bus speed; pageable memory would stage every copy through a bounce buffer."""
    if device.type != "cuda":
        return
    module._apply(to_host)  # what module.to("cpu") does, with pinned destinations
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    _move_optimizer_state(optimizer, to_host)
    torch.cuda.current_stream(device).synchronize()  # the host copies are complete before anything reads them
    torch.cuda.empty_cache()


def reload(module: torch.nn.Module, device: torch.device, optimizer: torch.optim.Optimizer | None = None,
           values: bool = True) -> None:
    """Undo ``offload`` (copies from pinned memory run asynchronously, in stream order before any use).
    ``values=False``: the parameters get device memory but not their old values (a rollout engine about to
    load a whole new version: copying the old ones over first would move the model twice)."""
    if device.type != "cuda":
        return
    if not values:
        allocate(module, device)
        return
    module.to(device, non_blocking=True)
    _move_optimizer_state(optimizer, lambda t: t.to(device, non_blocking=True))


def allocate(module: torch.nn.Module, device: torch.device) -> None:
    """Every parameter gets uninitialised memory on ``device`` (tied ones stay one parameter); buffers move
    with their values (rotary tables and the like, which no weight update carries)."""
    with torch.no_grad():
        for p in module.parameters():
            p.data = torch.empty_like(p.data, device=device)
        for m in module.modules():
            for name, b in m._buffers.items():
                if b is not None:
                    m._buffers[name] = b.to(device, non_blocking=True)


def to_host(t: torch.Tensor) -> torch.Tensor:
    """``t`` in host memory: pinned for a plain device tensor (asynchronous copy), else as ``t.to("cpu")``
    (a sharded DTensor moves its own shard; pinning can fail where page-locked memory is limited)."""
    if t.device.type == "cpu" or type(t) not in (torch.Tensor, torch.nn.Parameter):
        return t.to("cpu")
    try:
        host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
    except RuntimeError:
        return t.to("cpu")
    return host.copy_(t, non_blocking=True)


def kv_token_budget(model: torch.nn.Module, device: torch.device, share: float, dtype: torch.dtype) -> int:
    """KV-cache tokens that fit in ``share`` of ``device``'s memory beside what this process already holds
    (the engine's weights, and a hybrid rank's training state): what ``rollout.gpu_memory_utilization``
    means for the HF engine, as it does for vLLM's paged cache. At least 1 (a row alone always runs)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    per_token = 2 * config.num_hidden_layers * kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()
    free = share * torch.cuda.get_device_properties(device).total_memory - torch.cuda.memory_allocated(device)
    return max(1, int(free // per_token))


def _move_optimizer_state(optimizer: torch.optim.Optimizer | None, move) -> None:
    if optimizer is None:
        return
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":
                state[key] = move(value)


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in the backward pass (model.gradient_checkpointing).

    transformers 5 renamed gradient checkpointing to activation checkpointing (the old name warns and
    goes in v6); both use non-reentrant torch checkpointing by default."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()
