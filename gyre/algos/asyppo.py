"""AsyPPO: asymmetric PPO with M mini-critics on disjoint data ("Asymmetric Proximal Policy Optimization:
mini-critics boost LLM reasoning", arXiv 2510.01656; reference notes section 3.2).

- ``aggregate_values``: the critics' values [M, B, T] -> the value GAE uses (the mean, which the paper's
  ablation favours; the min is kept as the alternative it compares) and the disagreement
  ``sigma_t = std_m V_m(s_t)`` (population std, ddof 0; the masks rank sigma, which any ddof scales alike).
- ``disagreement_masks``: ranking sigma over the valid tokens of the batch, the advantage mask I^A (0 on the
  lowest ``ceil(k * n_valid)`` tokens: the critics agree, the state carries little information) and the
  entropy filter I^H (0 on the highest ``ceil(h * n_valid)``: noisy states weakly tied to the outcome).
  Ties are broken by position (row-major: the earlier token is chosen first) [ours]. The objective is
  ``J = E[(1/|o|) sum_t (I^A_t * min(rho_t A_t, clip(rho_t) A_t) + beta * I^H_t * H_t)]``: masked tokens keep
  their place in the denominators, so the masks multiply the advantage and the entropy, not the token mask.
- ``critic_rows``: which batch rows each critic trains on. ``group_response_split`` (default [ours]) gives the
  j-th response of every prompt group to critic ``j mod M``; ``prompt_shard`` gives whole prompt groups to
  critics in turn (group g to critic ``g mod M``). The paper's two descriptions disagree; both are offered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gyre.algos.specs import DataDivision, ValueAggregation


@dataclass(frozen=True)
class DisagreementMasks:
    """AsyPPO's two token masks, [B, T] float 0/1 (1 outside the valid tokens too: they are masked elsewhere)."""

    advantage: torch.Tensor
    """I^A: 0 on the valid tokens whose sigma is among the lowest k%."""
    entropy: torch.Tensor
    """I^H: 0 on the valid tokens whose sigma is among the highest h%."""


def aggregate_values(values: torch.Tensor, how: ValueAggregation = "mean") -> tuple[torch.Tensor, torch.Tensor]:
    """(aggregated value [B, T], sigma [B, T]) of the M critics' values ``values`` [M, B, T].

    sigma is the population std over the critics (0 for a single critic)."""
    if values.dim() != 3 or values.shape[0] < 1:
        raise ValueError(f"values must be [M, B, T] with M >= 1, got shape {tuple(values.shape)}")
    sigma = values.std(dim=0, correction=0)
    if how == "mean":
        return values.mean(dim=0), sigma
    if how == "min":
        return values.min(dim=0).values, sigma
    raise ValueError(f"unknown value aggregation {how!r} (mean or min)")


def rank_count(fraction: float, n_valid: int) -> int:
    """``ceil(fraction * n_valid)``, immune to float noise (0.7 * 10 is 7.000000000000001 in binary)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"a fraction of tokens must lie in [0, 1], got {fraction}")
    return min(n_valid, math.ceil(round(fraction * n_valid, 9)))


def extreme_tokens(sigma: torch.Tensor, mask: torch.Tensor, fraction: float, highest: bool) -> torch.Tensor:
    """[B, T] float: 1 on the ``ceil(fraction * n_valid)`` valid tokens with the lowest (or ``highest``) sigma,
    0 elsewhere. Only valid tokens (``mask`` 1) are ranked, so padding is never chosen whatever it holds
    (NaN included); among equal sigmas the earlier token (row-major) is chosen first."""
    valid = mask.reshape(-1).bool()
    positions = valid.nonzero().squeeze(1)
    count = rank_count(fraction, int(positions.numel()))
    chosen = torch.zeros(valid.shape, dtype=torch.float32)
    if count == 0:
        return chosen.reshape(sigma.shape)
    keys = sigma.reshape(-1)[positions].to(torch.float64)
    # A stable ascending sort keeps equal keys in position order; negating the keys ranks the highest first.
    order = torch.sort(-keys if highest else keys, stable=True).indices
    chosen[positions[order[:count]]] = 1.0
    return chosen.reshape(sigma.shape)


def disagreement_masks(sigma: torch.Tensor, mask: torch.Tensor, adv_low_frac: float,
                       entropy_high_frac: float) -> DisagreementMasks:
    """AsyPPO's I^A (lowest ``adv_low_frac`` of sigma -> 0) and I^H (highest ``entropy_high_frac`` -> 0).

    Args:
        sigma: [B, T] the critics' disagreement at each token.
        mask: [B, T] 1 on the valid tokens of the batch (the ones ranked).
        adv_low_frac: k, the fraction of valid tokens whose advantage is masked (the paper's 0.2).
        entropy_high_frac: h, the fraction of valid tokens filtered out of the entropy term (the paper's 0.2).
    """
    low = extreme_tokens(sigma, mask, adv_low_frac, highest=False)
    high = extreme_tokens(sigma, mask, entropy_high_frac, highest=True)
    return DisagreementMasks(advantage=1.0 - low, entropy=1.0 - high)


def critic_rows(group_index: torch.Tensor, num_critics: int,
                division: DataDivision = "group_response_split") -> list[torch.Tensor]:
    """The batch rows each of ``num_critics`` critics trains on: disjoint, covering every row.

    Args:
        group_index: [B] int, the prompt group of each row (rows of a group in response order); -1 marks a
            padding row, dealt to the critics in turn so their shares stay even.
        num_critics: M.
        division: group_response_split (the j-th response of each group to critic j mod M) or prompt_shard
            (the g-th group, in order of first appearance, to critic g mod M).

    Returns:
        M int64 tensors of row indices, each ascending.
    """
    if num_critics < 1:
        raise ValueError(f"num_critics must be >= 1, got {num_critics}")
    if division not in ("group_response_split", "prompt_shard"):
        raise ValueError(f"unknown data division {division!r} (group_response_split or prompt_shard)")
    owner = torch.empty(group_index.shape[0], dtype=torch.int64)
    seen: dict[int, int] = {}  # group -> responses dealt so far (or its order of appearance, for prompt_shard)
    padding = 0
    for row, g in enumerate(group_index.tolist()):
        if g < 0:
            owner[row], padding = padding % num_critics, padding + 1
        elif division == "group_response_split":
            j = seen.get(g, 0)
            owner[row], seen[g] = j % num_critics, j + 1
        else:
            owner[row] = seen.setdefault(g, len(seen)) % num_critics
    return [(owner == m).nonzero().squeeze(1) for m in range(num_critics)]
