"""Which rows of a batch go into one forward pass: by row count or by a token budget.

Rows are right-padded, so a micro-batch of padded rows costs (rows x its longest row) tokens, and a
packed one costs the sum of its rows' lengths. Ordering rows longest-first before cutting puts rows of
similar length together, so padded micro-batches carry little padding and packed ones fill their budget.
Any grouping gives the same step loss and gradient: the losses scale each micro-batch by the global
denominators of the whole optimizer step (``gyre.algos.aggregation``), never by the micro-batch's own size.
"""

from __future__ import annotations

import torch

from gyre.engines.pack_attention import DENSE_MASK_PACK_TOKENS
from gyre.engines.specs import MemoryLevers


def plan_micro_batches(lengths: torch.Tensor, rows: int, levers: MemoryLevers,
                       dense_mask: bool = False) -> list[torch.Tensor]:
    """Row indices of each micro-batch, covering every row once.

    Args:
        lengths: [B] tokens of each row (its attention-mask sum).
        rows: most rows per micro-batch when ``levers.micro_batch_tokens`` is None.
        levers: the budget and the padding mode; a row longer than the budget goes alone.
        dense_mask: the attention kernel takes a packed micro-batch's mask as a dense [N, N] tensor (eager,
            sdpa; ``gyre.engines.pack_attention``): without a budget, packed micro-batches then also stay
            within ``DENSE_MASK_PACK_TOKENS``. Flex attention's block-sparse mask and flash-attention's
            variable-length kernel cost about what the rows alone cost, so they keep the row cut alone.
    """
    n = len(lengths)
    order = torch.arange(n) if levers.remove_padding == "none" else _longest_first(lengths)
    if levers.micro_batch_tokens is not None:
        return _by_budget(order, lengths.tolist(), levers.micro_batch_tokens, levers.pack)
    if levers.pack and dense_mask:
        groups = _by_budget(order, lengths.tolist(), DENSE_MASK_PACK_TOKENS, pack=True)
        return [g[i:i + rows] for g in groups for i in range(0, len(g), rows)]
    return [order[i:i + rows] for i in range(0, n, rows)]


def _by_budget(order: torch.Tensor, sizes: list[int], budget: int, pack: bool) -> list[torch.Tensor]:
    """Rows in ``order`` added to a micro-batch while it stays within ``budget`` tokens (packed: the sum
    of its rows; padded: rows x the longest); a row longer than the budget goes alone."""
    groups: list[list[int]] = []
    total = longest = 0
    for row in order.tolist():
        size = sizes[row]
        if not groups:
            cost = size
        elif pack:
            cost = total + size
        else:
            cost = (len(groups[-1]) + 1) * max(longest, size)
        if not groups or cost > budget:
            groups.append([row])
            total = longest = size
        else:
            groups[-1].append(row)
            total, longest = total + size, max(longest, size)
    return [torch.tensor(g, dtype=torch.long) for g in groups]


def split_to_count(groups: list[torch.Tensor], count: int) -> list[torch.Tensor]:
    """``groups`` cut further until there are ``count`` of them (the largest group is halved each time).

    FSDP2 ranks run one set of collectives per forward pass, so every rank must run the same number;
    halving a group keeps both halves within the budget the group met."""
    groups = list(groups)
    if count > sum(len(g) for g in groups):
        raise ValueError(f"cannot make {count} micro-batches out of {sum(len(g) for g in groups)} rows")
    while len(groups) < count:
        big = max(range(len(groups)), key=lambda i: len(groups[i]))
        g = groups.pop(big)
        half = (len(g) + 1) // 2
        groups[big:big] = [g[:half], g[half:]]
    return groups


def _longest_first(lengths: torch.Tensor) -> torch.Tensor:
    # Stable, so equal lengths keep their batch order (a deterministic plan).
    return torch.sort(lengths, descending=True, stable=True).indices
