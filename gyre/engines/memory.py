"""Offload and reload of a role's device state, for roles that time-share a GPU.

On CPU there is nothing to free, so both are no-ops there. Gradients are dropped rather than moved:
the next backward pass recreates them.
"""

from __future__ import annotations

import torch


def offload(module: torch.nn.Module, device: torch.device, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Move parameters, buffers and optimizer state to host memory, drop gradients, release the cache."""
    if device.type != "cuda":
        return
    module.to("cpu")
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    _move_optimizer_state(optimizer, torch.device("cpu"))
    torch.cuda.empty_cache()


def reload(module: torch.nn.Module, device: torch.device, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Undo ``offload``."""
    if device.type != "cuda":
        return
    module.to(device)
    _move_optimizer_state(optimizer, device)


def _move_optimizer_state(optimizer: torch.optim.Optimizer | None, device: torch.device) -> None:
    if optimizer is None:
        return
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":
                state[key] = value.to(device, non_blocking=True)


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in the backward pass (model.gradient_checkpointing).

    transformers 5 renamed gradient checkpointing to activation checkpointing (the old name warns and
    goes in v6); both use non-reentrant torch checkpointing by default."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()
