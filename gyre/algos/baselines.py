"""Outcome baselines that read more than the group's rewards: ReMax, OPO, the pass@k advantage, GPG's scale.

Every function takes the rewards of N prompts with G samples each, [N, G], and returns advantages of the
same shape (one per response, broadcast over its tokens later); ``BaselineContext`` carries what they
need besides the rewards. The ``ESTIMATORS`` rows that use them are in ``gyre.algos.estimator_table``.

Papers:
- ReMax: Li et al., "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for Aligning
  Large Language Models" (arXiv 2310.10505), Algorithm 1: the baseline is the reward of the prompt's
  greedy response, ``A_i = r(x, a_i) - r(x, a_greedy)``.
- OPO: Hao et al., "On-Policy RL with Optimal Reward Baseline" (arXiv 2505.23585): the length-weighted
  group reward ``b = sum_j |o_j| r_j / sum_j |o_j|`` (the variance-optimal baseline when a response's
  squared gradient norm grows with its length), no std division.
- Pass@k: Chen et al., "Pass@k Training for Adaptively Balancing Exploration and Exploitation of Large
  Reasoning Models" (arXiv 2508.10751), the analytical advantage of section "Analytical Derivation": with
  G samples of which N_neg fail, the k-subset reward mean ``R = 1 - C(N_neg, k) / C(G, k)``, its std
  ``s = sqrt(R (1 - R))``, ``A_pos = (1 - R) / s`` and
  ``A_neg = (1 - R - C(N_neg - 1, k - 1) / C(G - 1, k - 1)) / s``.
- GPG: Chu et al., "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning"
  (arXiv 2504.02546): ``A_i = alpha (r_i - mean_g r) / F_norm`` with ``alpha = B / (B - M)``, M the samples
  of groups whose rewards are all equal (they carry no gradient), so the batch's gradient is not diluted.

Deviations:
- Pass@k: the function computes, for each response, the mean over every k-subset of its group that
  contains it of the subset's *maximum* reward, minus the mean over all k-subsets, over the std of the
  subsets' maxima. For 0/1 rewards this is exactly Chen et al.'s A_pos / A_neg (the maximum is pass@k);
  for graded rewards it is the max@k generalisation Walder & Karkhanis treat ("Pass@K Policy
  Optimization", arXiv 2505.15201). With k = 1 it is GRPO with the population std.
- GPG: verl's ``gpg`` estimator counts M as the samples with reward 0; gyre follows the paper and the
  authors' code (samples in groups of equal rewards). alpha is 1 when no group varies (every advantage is
  then 0 anyway). The authors' resampling until a share beta_th of the samples is valid is a rollout
  matter (``rollout.dynamic_sampling``).
- OPO: a group whose responses are all empty falls back to the plain group mean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BaselineContext:
    """What some response-level baselines read besides the rewards [N, G]."""

    lengths: torch.Tensor | None = None
    """[N, G] model tokens of each response (OPO's weights)."""
    greedy: torch.Tensor | None = None
    """[N] reward of each prompt's greedy response (ReMax's baseline)."""

    def rows(self, index: torch.Tensor) -> BaselineContext:
        """The context of the groups ``index`` (running scopes normalise per tag, a subset of the groups)."""
        return BaselineContext(self.lengths[index] if self.lengths is not None else None,
                               self.greedy[index] if self.greedy is not None else None)


def _float(x: torch.Tensor) -> torch.Tensor:
    """fp64 stays fp64 (tests, exact maths); everything else is computed in fp32."""
    return x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)


def remax_advantages(rewards: torch.Tensor, greedy: torch.Tensor) -> torch.Tensor:
    """ReMax: each response's reward minus its prompt's greedy reward, ``A_i = r_i - r_greedy``.

    Args:
        rewards: [N, G] rewards of the sampled responses (G may be 1, as in the paper).
        greedy: [N] reward of each prompt's greedy (temperature 0) response.

    Returns:
        [N, G] advantages.
    """
    if rewards.dim() != 2 or greedy.shape != rewards.shape[:1]:
        raise ValueError(f"ReMax needs rewards [N, G] and greedy rewards [N], got shapes {tuple(rewards.shape)} and "
                         f"{tuple(greedy.shape)}")
    r = _float(rewards)
    return r - greedy.to(r.dtype)[:, None]


def opo_advantages(rewards: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """OPO: ``A_i = r_i - sum_j |o_j| r_j / sum_j |o_j|`` within each group (no std division).

    Args:
        rewards: [N, G] outcome rewards.
        lengths: [N, G] response lengths |o_j| (model tokens).

    Returns:
        [N, G] advantages; the length-weighted (not the plain) mean of each row is 0.
    """
    if rewards.shape != lengths.shape or rewards.dim() != 2:
        raise ValueError(f"OPO needs rewards and lengths of one shape [N, G], got {tuple(rewards.shape)} and "
                         f"{tuple(lengths.shape)}")
    r = _float(rewards)
    w = lengths.to(r.dtype)
    total = w.sum(dim=1, keepdim=True)
    weighted = (w * r).sum(dim=1, keepdim=True) / total.clamp(min=1)
    baseline = torch.where(total > 0, weighted, r.mean(dim=1, keepdim=True))
    return r - baseline


def _subset_weights(g: int, k: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """For rewards sorted ascending (1-indexed positions a, b):
    ``p[b] = C(b-1, k-1) / C(g, k)``, the chance that position b is the maximum of a uniform k-subset; and
    ``m[a, b]``, the share of the k-subsets holding a whose maximum is b: ``C(a-1, k-1)`` on the diagonal,
    ``C(b-2, k-2)`` for b > a, over ``C(g-1, k-1)``."""
    p = [math.comb(b - 1, k - 1) / math.comb(g, k) for b in range(1, g + 1)]
    m = [[(math.comb(a - 1, k - 1) if b == a else math.comb(b - 2, k - 2) if b > a and k >= 2 else 0)
          / math.comb(g - 1, k - 1) for b in range(1, g + 1)] for a in range(1, g + 1)]
    return torch.tensor(p, dtype=dtype), torch.tensor(m, dtype=dtype)


def pass_at_k_advantages(rewards: torch.Tensor, k: int, eps: float = 1e-6) -> torch.Tensor:
    """The pass@k advantage (Chen et al. 2025): how much a response raises the best-of-k reward of its group.

    ``A_i = (mean over k-subsets S containing i of max_S r  -  mean over all k-subsets of max_S r) / (s + eps)``,
    s the std of ``max_S r`` over all k-subsets; for 0/1 rewards these are the paper's A_pos and A_neg.

    Args:
        rewards: [N, G] outcome rewards.
        k: subset size, 1 <= k <= G (k = 1: GRPO with the population std).
        eps: added to s, so a group of equal rewards gets 0.

    Returns:
        [N, G] advantages; each row sums to 0.
    """
    if rewards.dim() != 2:
        raise ValueError(f"pass@k needs rewards [N, G], got shape {tuple(rewards.shape)}")
    g = rewards.shape[1]
    if not 1 <= k <= g:
        raise ValueError(f"pass@k needs 1 <= k <= G (the samples of a prompt), got k={k}, G={g}")
    r = _float(rewards)
    ordered, order = torch.sort(r, dim=1, stable=True)
    p, m = _subset_weights(g, k, r.dtype)
    mean = ordered @ p  # [N]: the mean best-of-k reward of each group
    spread = (ordered.square() @ p - mean.square()).clamp(min=0).sqrt()
    containing = ordered @ m.T  # [N, G]: per sorted position, the mean best-of-k of the subsets holding it
    sorted_adv = (containing - mean[:, None]) / (spread[:, None] + eps)
    return torch.empty_like(r).scatter_(1, order, sorted_adv)


def gpg_alpha(rewards: torch.Tensor) -> float:
    """GPG's correction ``alpha = B / (B - M)``: all samples over those in groups whose rewards differ.

    Args:
        rewards: [N, G] outcome rewards.

    Returns:
        alpha >= 1; 1 when no group has differing rewards.
    """
    varied = rewards.amax(dim=1) > rewards.amin(dim=1)
    valid = int(varied.sum()) * rewards.shape[1]
    return rewards.numel() / valid if valid else 1.0
