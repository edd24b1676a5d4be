"""Offload and reload of a role's device state, for roles that time-share a GPU.

On CPU there is nothing to free, so both are no-ops there. ``module`` may be None: a wrapped training
model (DDP buckets, FSDP2 DTensor shards) keeps its parameters in place and frees only its gradients
and optimizer state, which are the larger share (Adam keeps two fp32 moments per parameter).
"""

from __future__ import annotations

import torch


def offload(module: torch.nn.Module | None, device: torch.device,
            optimizer: torch.optim.Optimizer | None = None) -> None:
    """Move parameters and buffers (of ``module``) and optimizer state to host memory, drop gradients,
    and release the cached blocks."""
    if device.type != "cuda":
        return
    if module is not None:
        module.to("cpu")
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    _move_optimizer_state(optimizer, torch.device("cpu"))
    torch.cuda.empty_cache()


def reload(module: torch.nn.Module | None, device: torch.device,
           optimizer: torch.optim.Optimizer | None = None) -> None:
    """Undo ``offload`` (gradients are recreated by the next backward pass)."""
    if device.type != "cuda":
        return
    if module is not None:
        module.to(device)
    _move_optimizer_state(optimizer, device)


def _move_optimizer_state(optimizer: torch.optim.Optimizer | None, device: torch.device) -> None:
    if optimizer is None:
        return
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":
                state[key] = value.to(device, non_blocking=True)
