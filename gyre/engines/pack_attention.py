"""Which attention kernel runs a role's packed micro-batches (``remove_padding: pack``), and what it costs.

A packed micro-batch is one [1, N] sequence of several rows; attention must stay within each row. The
kernels differ in how they learn the row boundaries, and so in cost:

- eager, sdpa: a dense block-diagonal causal mask [1, 1, N, N]; memory and attention work grow with N^2
  whatever the rows (4 rows of 4k tokens: 4x the work of the rows alone), so such micro-batches are also
  capped at ``DENSE_MASK_PACK_TOKENS`` when no token budget is set;
- flex_attention: a ``BlockMask`` (``packing.flex_block_mask``): only the 128 x 128 tiles a row covers
  are computed, so the work is that of the rows alone, plus the tiles that straddle a boundary;
- flash_attention_2/3: transformers' variable-length kernel, from the position ids alone.

No torch here: ``gyre check`` (the config layer) prints the same choice the workers make.
"""

from __future__ import annotations

DENSE_MASK_KINDS = ("eager", "sdpa")
"""Kernels that take a packed micro-batch's mask as a dense [N, N] tensor."""
BLOCK_MASK_KINDS = ("flex_attention",)
"""Kernels that take it as a block-sparse ``BlockMask``."""
DENSE_MASK_PACK_TOKENS = 4096
"""Tokens of a packed micro-batch when no budget is set (``micro_batch_tokens``) and the kernel takes the
dense mask: cut by rows alone, 128 rows of up to 512 tokens made one 65k-token sequence; a step of 40k
such tokens trained in 93 s, in 9 s within this budget (tiny model, 2-core CPU)."""


def packing_attention(requested: str | None, device_kind: str, packed: bool, flash_attn: bool,
                      samples: bool = False) -> str | None:
    """The attention kernel a role loads its model with (``model.attn_implementation``; None: transformers'
    choice, sdpa for most models).

    Set, it is kept. Unset, a role whose micro-batches are packed on CUDA GPUs gets flash_attention_2 when
    flash-attn imports (``flash_attn``), else flex_attention, so packing never pays the dense N x N mask;
    on CPU it keeps transformers' sdpa and the dense mask (torch 2.13 has no flex-attention backward on
    CPU, and compiles its forward for every new packed length). ``samples``: the model also generates
    (the policy under a hybrid rollout), where flex attention would be compiled for every decoding shape:
    it then keeps sdpa unless flash-attn imports."""
    if requested is not None or not packed or device_kind != "cuda":
        return requested
    if flash_attn:
        return "flash_attention_2"
    return None if samples else "flex_attention"


def role_attention(requested: str | None, device_kind: str, packed: bool, samples: bool = False) -> str | None:
    """``packing_attention`` as a worker resolves it before loading its model: flash-attn is imported (on the
    worker's own host) only when the choice depends on it."""
    auto = requested is None and packed and device_kind == "cuda"
    return packing_attention(requested, device_kind, packed, auto and flash_attn_importable(), samples)


def flash_attn_importable() -> bool:
    """flash-attn imports in this process (what transformers' flash_attention_2 loads); a broken build (a
    CUDA or torch ABI mismatch) counts as absent."""
    try:
        import flash_attn  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure means transformers could not use it either
        return False
    return True


def packing_cost(kind: str | None, micro_batch_tokens: int | None) -> str:
    """One line for ``gyre check``: how a packed micro-batch keeps rows apart under ``kind`` and what it costs."""
    if kind in BLOCK_MASK_KINDS:
        return f"{kind} block mask (block-sparse: the work of the rows alone)"
    if kind is not None and kind.startswith("flash_attention"):
        return f"{kind} variable-length kernel (row boundaries from position ids)"
    name = kind or "sdpa (transformers' default)"
    cap = (f"micro-batches within micro_batch_tokens={micro_batch_tokens}" if micro_batch_tokens
           else f"micro-batches capped at {DENSE_MASK_PACK_TOKENS} tokens")
    return f"{name} dense N x N mask (memory and work grow with N^2), {cap}"
