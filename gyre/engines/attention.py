"""The opt-in attention pass of attention-based credit (``gyre.algos.attention_credit``).

One no-grad forward of the policy over each micro-batch with eager attention (the fused kernels never
materialise the maps), reading the attention weights of the sampled middle-third layers through forward
hooks on their attention modules, so only those layers' [rows, heads, N, N] maps exist at once. The
rows are padded (the packing lever does not apply: the maps are per row). The result is each response
token's credit scale gamma; its cost is measured by ``bench/attention_credit.py``.
"""

from __future__ import annotations

import contextlib

import torch

from gyre.algos.attention_credit import CreditSpec, credit_scales, middle_third_layers, token_metrics
from gyre.engines.forward import ForwardContext, micro_batches
from gyre.models.logprobs import entropy_from_logits
from gyre.types import TrainBatch


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The self-attention module of every decoder layer, in order (Hugging Face decoder models)."""
    found = [m for name, m in model.named_modules() if name.endswith("self_attn")]
    if not found:
        raise ValueError(f"attention-based credit reads the attention of decoder layers, but {type(model).__name__} "
                         "has no self_attn modules; use algorithm.credit.strategy random or entropy")
    return found


@contextlib.contextmanager
def eager_attention(model: torch.nn.Module):
    """Run ``model`` with eager attention inside the block (it returns the weights), then restore its kernel."""
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(before)


@contextlib.contextmanager
def captured_attention(modules: list[torch.nn.Module]):
    """A list that each forward fills with the ``modules``' attention weights ([rows, heads, N, N] each)."""
    maps: list[torch.Tensor] = []

    def keep(module, args, output):
        maps.append(output[1].detach())

    handles = [m.register_forward_hook(keep) for m in modules]
    try:
        yield maps
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def attention_credit_scales(model: torch.nn.Module, batch: TrainBatch, fwd: ForwardContext, spec: CreditSpec,
                            temperature: float, groups: list[torch.Tensor]) -> torch.Tensor:
    """[B, L] float32 on CPU: each response token's gamma under ``spec`` (entropy or an attention
    strategy), 1 elsewhere. ``model`` is the unwrapped Hugging Face model; ``groups`` the micro-batches."""
    out = torch.ones(batch.input_ids.shape, dtype=torch.float32)
    modules = attention_modules(model)
    sampled = [modules[i] for i in middle_third_layers(len(modules), spec.layers)] if spec.needs_attention else []
    with eager_attention(model), captured_attention(sampled) as maps:
        for rows, micro in zip(groups, micro_batches(batch, groups)):
            maps.clear()
            with fwd.autocast():
                logits = model(input_ids=micro.input_ids.to(fwd.device),
                               attention_mask=micro.attention_mask.to(fwd.device), use_cache=False).logits
            for i, row in enumerate(rows.tolist()):
                _row_scales(out[row], micro, i, logits[i], [m[i] for m in maps], spec, temperature)
    return out


def _row_scales(out: torch.Tensor, micro: TrainBatch, i: int, logits: torch.Tensor, maps: list[torch.Tensor],
                spec: CreditSpec, temperature: float) -> None:
    """Fill ``out`` (one row of the result) at the row's response tokens."""
    n = int(micro.attention_mask[i].sum())  # right-padded: the real tokens are 0..n-1
    response = micro.response_mask[i, :n] > 0
    idx = torch.nonzero(response).flatten()
    if idx.numel() == 0:
        return
    w = f = entropy = None
    if maps:
        attn = torch.cat([m[:, :n, :n] for m in maps]).float().cpu()  # [layers x heads, n, n]
        w, f = (x[idx] for x in token_metrics(attn, response, spec))
    if spec.strategy == "entropy":  # token p's distribution is the output at p - 1
        entropy = entropy_from_logits(logits[idx - 1][None], temperature)[0].cpu()
    out[idx] = credit_scales(spec, idx.numel(), w, f, entropy)
