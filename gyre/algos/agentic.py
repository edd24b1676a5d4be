"""Multi-turn (agentic) credit assignment: one advantage per model turn, from per-turn rewards and states.

Shapes: E trajectories padded to K turns. A trajectory's turns fill a prefix of its row (``mask`` 1 on the
turns that happened, 0 on padding); each turn's value is later spread over that turn's model tokens
(``gyre.data.batching.TurnLayout.broadcast``). Turn rewards are the environment's reward for each action.

Papers:
- Step-level returns ``G_t = sum_{k>=t} gamma^(k-t) r_k`` per turn: REINFORCE over turns; ROLL
  ``step_reinforce`` before its normalisation, and ROLL ``agentic_reinforce``'s segment recursion
  ``G_s = r_s + gamma * G_{s+1}`` (the same numbers).
- ReBN: GEM (arXiv 2510.01051): those returns normalised over every transition of the batch.
- GiGPO: Feng et al. (arXiv 2505.10978): ``A = w_E * A^E + w_S * A^S``, an episode-level group advantage
  plus a step-level one over anchor groups, the turns of one trajectory group that acted on the same state.
- IPA, "Let It Flow" (arXiv 2512.24873): chunk returns ``G_k = gamma^(K-1-k) * R_final``, one chunk per
  model turn.

Deviations:
- GiGPO: an anchor group of one turn (or of equal returns) gets step advantage 0, the formula's numerator
  (ROLL zeroes these too; verl-agent's GiGPO uses mean 0 and std 1 for a singleton, i.e. the raw return).
  Anchors are formed from the turns of trajectory-level samples (ROLL uses step-level samples: one
  advantage per turn either way). The std's ddof is a parameter (ROLL and verl-agent use 1; the
  reference's worked example uses 0). The episode level is computed by the caller (it is GRPO's group
  normalisation of the episode returns) and passed in.
- ReBN: the std's ddof is a parameter (GEM uses 0) and the default eps is 1e-6 (GEM: 1e-9). GEM's
  subsampling of a fixed number of transitions is left to the batch size.
- IPA: the decisive chunk is the last model turn (the outcome is paid when the episode ends); IPA's
  chunk importance ratio, chunk mismatch mask and crucial-fork resampling are not part of the advantage.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gyre.algos.stats import masked_mean, masked_var, where_valid


def _float(x: torch.Tensor) -> torch.Tensor:
    """fp64 stays fp64 (tests, exact maths); everything else is computed in fp32."""
    return x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)


def _power(gamma: float, exponents: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``gamma ** max(exponents, 0)`` in ``like``'s dtype (gamma 0 gives 1 at exponent 0)."""
    base = torch.tensor(gamma, dtype=like.dtype, device=like.device)
    return base ** exponents.clamp(min=0).to(like.dtype)


def turn_returns(turn_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Step-level discounted returns ``G_t = sum_{k>=t} gamma^(k-t) r_k`` over each trajectory's turns.

    Args:
        turn_rewards: [E, K] reward of each turn (padding ignored, even NaN).
        mask: [E, K] 1 on the turns that happened; they fill a prefix of each row.
        gamma: discount per turn.

    Returns:
        [E, K] returns, 0 on padding.
    """
    # Selected, not multiplied by the mask: a NaN on padding would otherwise spread through the product.
    r = where_valid(_float(turn_rewards), mask)
    k = torch.arange(r.shape[1], device=r.device)
    steps = k[None, :] - k[:, None]  # [t, k]: how many turns k lies after t
    # G = r @ W^T with W[t, k] = gamma^(k - t) for k >= t: the whole recursion as one product.
    weights = torch.where(steps >= 0, _power(gamma, steps, r), 0.0)
    return where_valid(r @ weights.T, mask)


def chunk_returns(final_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """IPA chunk returns: ``G_k = gamma^(K_e-1-k) * R_final`` for the K_e model turns (chunks) of trajectory e.

    Equal to ``turn_returns`` of a trajectory rewarded only at its last turn.

    Args:
        final_rewards: [E] each trajectory's outcome R_final.
        mask: [E, K] 1 on the turns that happened (a prefix of each row).
        gamma: discount per chunk.

    Returns:
        [E, K] returns, 0 on padding (and for a trajectory without turns).
    """
    valid = mask > 0
    r = _float(final_rewards)
    after = valid.sum(dim=1, keepdim=True) - 1 - torch.arange(valid.shape[1], device=valid.device)[None, :]
    discount = _power(gamma, after, r)
    return torch.where(valid, r[:, None] * discount, torch.zeros_like(discount))


def rebn_advantages(turn_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, eps: float = 1e-6,
                    ddof: int = 1) -> torch.Tensor:
    """ReBN: per-turn discounted returns, normalised over all valid transitions of the batch.

    Args:
        turn_rewards: [E, K] reward of each turn, E episodes of up to K turns.
        mask: [E, K] 1 for turns that happened (a prefix of each row; padding 0).
        gamma: discount per turn (GEM uses 0.9 for multi-turn games).
        eps: added to the std (GEM uses 1e-9; gyre's default is 1e-6).
        ddof: std degrees of freedom (GEM's numbers use 0).

    Returns:
        [E, K] per-turn advantages, to broadcast over the turn's action tokens; 0 off-mask.
    """
    returns = turn_returns(turn_rewards, mask, gamma)
    valid = mask > 0
    m = valid.to(returns.dtype)
    mean = masked_mean(returns, m)
    std = masked_var(returns, m, ddof=ddof).sqrt()
    return torch.where(valid, (returns - mean) / (std + eps), torch.zeros_like(returns))


def grouped_normalize(values: torch.Tensor, ids: torch.Tensor, std: bool, eps: float = 1e-6,
                      ddof: int = 1) -> torch.Tensor:
    """``(x - mean_g) / (std_g + eps)`` within the groups that ``ids`` names (groups of any size).

    Args:
        values: [M] values.
        ids: [M] integer group of each value (equal ids: one group).
        std: divide by the group's std; False subtracts the mean only (eps unused).
        eps: added to the std (may be 0).
        ddof: std degrees of freedom; a group of at most ``ddof`` values gets std 0.

    Returns:
        [M]; a group of one value (or of equal values) gets 0.
    """
    x = _float(values)
    _, inverse, counts = torch.unique(ids, return_inverse=True, return_counts=True)
    n = counts.to(x.dtype)
    mean = torch.zeros_like(n).index_add_(0, inverse, x) / n
    centred = x - mean[inverse]
    if not std:
        return centred
    squares = torch.zeros_like(n).index_add_(0, inverse, centred.square())
    var = torch.where(n > ddof, squares / (n - ddof).clamp(min=1e-12), torch.zeros_like(n))
    scale = var.sqrt() + eps
    # A zero std means equal values (centred 0): divide by 1 there, so that eps = 0 gives 0, not NaN.
    return centred / torch.where(scale > 0, scale, torch.ones_like(scale))[inverse]


def anchor_ids(groups: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """GiGPO's anchor groups: one id per distinct (trajectory group, state) pair.

    Args:
        groups: [E] trajectory group of each trajectory.
        states: [E, K] state id each turn acted on.

    Returns:
        [E, K] anchor id of each turn (equal ids: same group and same state).
    """
    pairs = torch.stack([groups[:, None].expand_as(states), states], dim=-1).reshape(-1, 2)
    _, inverse = torch.unique(pairs, dim=0, return_inverse=True)
    return inverse.reshape(states.shape)


def gigpo_step_advantages(turn_rewards: torch.Tensor, mask: torch.Tensor, groups: torch.Tensor,
                          states: torch.Tensor, gamma: float = 0.95, std: bool = True, eps: float = 1e-6,
                          ddof: int = 1) -> torch.Tensor:
    """GiGPO's step level ``A^S = (R_t - mean_anchor R) / F``, ``R_t`` the turn's discounted return.

    Args:
        turn_rewards: [E, K] reward of each turn.
        mask: [E, K] 1 on the turns that happened (a prefix of each row).
        groups: [E] trajectory group of each trajectory (anchors never span groups).
        states: [E, K] state id each turn acted on (equal ids within a group: one anchor group).
        gamma: ``step_reward_gamma`` (0.95 in ROLL and the paper).
        std: F is the anchor group's std; False is the std-free variant (F = 1).
        eps, ddof: of that std.

    Returns:
        [E, K] step advantages, 0 on padding.
    """
    valid = mask > 0
    returns = turn_returns(turn_rewards, mask, gamma)
    anchors = anchor_ids(groups, states)
    out = torch.zeros_like(returns)
    out[valid] = grouped_normalize(returns[valid], anchors[valid], std, eps, ddof)
    return out


def gigpo_advantages(episode_advantages: torch.Tensor, turn_rewards: torch.Tensor, mask: torch.Tensor,
                     groups: torch.Tensor, states: torch.Tensor, step_gamma: float = 0.95,
                     episode_weight: float = 1.0, step_weight: float = 1.0, std: bool = True, eps: float = 1e-6,
                     ddof: int = 1) -> torch.Tensor:
    """GiGPO: ``A = w_E * A^E + w_S * A^S`` per turn.

    Args:
        episode_advantages: [E] A^E, the episode returns normalised within their trajectory group
            (``normalize_rewards(R, "group", "group")``; mean only for the std-free variant).
        turn_rewards, mask, groups, states, std, eps, ddof: as ``gigpo_step_advantages``.
        step_gamma: discount of the step level's returns.
        episode_weight, step_weight: w_E and w_S (ROLL ``episode_reward_weight`` / ``step_reward_weight``).

    Returns:
        [E, K] per-turn advantages, 0 on padding.
    """
    step = gigpo_step_advantages(turn_rewards, mask, groups, states, step_gamma, std, eps, ddof)
    episode = where_valid(_float(episode_advantages).to(step.dtype)[:, None], mask)
    return episode_weight * episode + step_weight * step


@dataclass(frozen=True)
class TurnBatch:
    """What a turn-level estimator reads: the turns of E trajectories, padded to K."""

    rewards: torch.Tensor
    """[E, K] the environment's reward for each turn."""
    mask: torch.Tensor
    """[E, K] 1 on the turns that happened (a prefix of each row)."""
    outcomes: torch.Tensor
    """[E] each trajectory's response-level reward: its score after the response-level baseline (the
    normalisation scopes of a scoped estimator; the score itself otherwise)."""
    groups: torch.Tensor
    """[E] int64, the trajectory group of each trajectory."""
    states: torch.Tensor
    """[E, K] int64, the state each turn acted on (equal ids: equal state keys)."""

