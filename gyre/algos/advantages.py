"""Advantage estimators: outcome normalisation (critic-free), returns and GAE.

Papers:
- GRPO: DeepSeekMath (Shao et al., arXiv 2402.03300), ``A_i = (r_i - mean_g r) / (std_g r + eps)``.
- Dr.GRPO (arXiv 2503.20783): group mean, no std.
- RLOO: "Back to Basics" (Ahmadian et al., arXiv 2402.14740), leave-one-out baseline.
- REINFORCE++ and REINFORCE++-baseline (arXiv 2501.03262): the KL penalty goes into the token rewards, the
  returns are taken, and the returns are normalised over every valid token of the batch (the advantage
  stage's whitening: ``gyre.algos.stats.masked_whiten``, the presets' ``advantage.whiten``); the baseline
  variant subtracts the group mean of the outcome first (``normalize_rewards(r, "group", "none")``).
- Lite PPO: "Tricks or Traps?" (arXiv 2508.08221): group mean, batch std.
- GAE: Schulman et al. (arXiv 1506.02438).
- Multi-turn estimators (step-level returns, ReBN, GiGPO, IPA chunk returns): ``gyre.algos.agentic``.
- Baselines that read more than the rewards (ReMax's greedy response, OPO's lengths, the pass@k advantage,
  GPG's scale): ``gyre.algos.baselines``.

The table of the estimators by config name, with each one's knobs, is the torch-free
``gyre.algos.estimator_table.ESTIMATORS``, whose functions call these.

``normalize_rewards`` chooses the mean scope and the std scope independently (ROLL ``norm_mean_type`` /
``norm_std_type``); the named estimators are scope pairs:
- GRPO = ``normalize_rewards(r, "group", "group")`` (also ``group_normalized_advantages``);
- Dr.GRPO = ``normalize_rewards(r, "group", "none")``;
- Lite PPO = ``normalize_rewards(r, "group", "batch")``;
- ``normalize_rewards(r, "batch", "batch")`` is ROLL's "reinforce++" configuration: the outcome normalised
  over responses before the KL penalty enters, not the paper's normalisation of the returns (above).

Token-level functions (``discounted_returns``, ``gae_advantages``) skip positions whose mask
is 0: they neither receive a value nor break the recursion, so environment or tool tokens inside a multi-turn
row are transparent, and rewards placed on them are ignored.

Deviations: the std's ddof is a parameter (1 by default, torch's and TRL's convention; ROLL's choice is not
pinned down, GEM uses 0); GAE treats the last valid token as terminal (no bootstrap for truncated episodes).
``group_centred_batch_std`` is REINFORCE++-baseline with its batch std over responses instead of tokens
(ms-swift's form), under a name that says what it computes.
"""

from __future__ import annotations

import torch

from gyre.algos.baselines import gpg_alpha
from gyre.algos.estimator_table import NormScope
from gyre.algos.stats import RunningMoments


def _float(x: torch.Tensor) -> torch.Tensor:
    """fp64 stays fp64 (tests, exact maths); everything else is computed in fp32."""
    return x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)


def _check_groups(rewards: torch.Tensor, what: str) -> None:
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"{what} needs rewards of shape [num_groups, G>=2], got shape {tuple(rewards.shape)}")


def _batch_std(x: torch.Tensor, ddof: int) -> torch.Tensor:
    """Std over every element; 0 when there are too few elements for ``ddof`` (instead of NaN)."""
    if x.numel() <= ddof:
        return torch.zeros((), dtype=x.dtype, device=x.device)
    return x.std(correction=ddof)


def group_normalized_advantages(rewards: torch.Tensor, eps: float = 1e-6, ddof: int = 1) -> torch.Tensor:
    """GRPO advantages.

    Args:
        rewards: [num_groups, G] outcome rewards, one row per prompt, G >= 2 samples each.
        eps: added to the std so that a group of identical rewards gets advantage 0, not NaN.
        ddof: 1 for the sample std, 0 for the population std.

    Returns:
        [num_groups, G] advantages; each row sums to zero.
    """
    _check_groups(rewards, "GRPO")
    return normalize_rewards(rewards, "group", "group", eps, ddof)


def normalize_rewards(rewards: torch.Tensor, mean_scope: NormScope, std_scope: NormScope, eps: float = 1e-6,
                      ddof: int = 1, running: RunningMoments | None = None) -> torch.Tensor:
    """``(r - M) / (S + eps)`` with the mean scope and the std scope chosen independently.

    Args:
        rewards: [N, G] outcome rewards, N groups (prompts) of G samples.
        mean_scope: M is the group mean per row ("group"), the mean of all N*G rewards ("batch"),
            ``running.mean`` ("running") or 0 ("none").
        std_scope: S is the group std per row, the batch std, ``running.std(ddof)``, or "none" (S = 1, eps = 0).
        eps: added to S.
        ddof: std degrees of freedom; a batch of a single reward gets S = 0.
        running: the running moments for the "running" scope. The caller updates them with this batch BEFORE
            calling (``running.update(rewards)``), so the current batch is part of its own statistics.

    Returns:
        [N, G] normalised rewards (advantages for outcome estimators).
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [N, G], got shape {tuple(rewards.shape)}")
    if "group" in (mean_scope, std_scope) and rewards.shape[1] < 2:
        raise ValueError(f"group normalisation needs G>=2 samples per group, got shape {tuple(rewards.shape)}")
    if "running" in (mean_scope, std_scope) and running is None:
        raise ValueError("the 'running' scope needs a RunningMoments (updated with this batch first)")
    r = _float(rewards)
    zero = torch.zeros((), dtype=r.dtype, device=r.device)

    if mean_scope == "group":
        mean = r.mean(dim=1, keepdim=True)
    elif mean_scope == "batch":
        mean = r.mean()
    elif mean_scope == "running":
        mean = zero + running.mean  # type: ignore[union-attr]
    elif mean_scope == "none":
        mean = zero
    else:
        raise ValueError(f"unknown mean scope {mean_scope!r}; use none, group, batch or running")

    if std_scope == "group":
        std = r.std(dim=1, keepdim=True, correction=ddof) if r.shape[1] > ddof else torch.zeros_like(r[:, :1])
    elif std_scope == "batch":
        std = _batch_std(r, ddof)
    elif std_scope == "running":
        std = zero + running.std(ddof)  # type: ignore[union-attr]
    elif std_scope == "none":
        std, eps = zero + 1.0, 0.0
    else:
        raise ValueError(f"unknown std scope {std_scope!r}; use none, group, batch or running")
    return (r - mean) / (std + eps)


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """RLOO: ``A_i = r_i - mean_{j != i} r_j = G/(G-1) * (r_i - mean_g r)``.

    Args:
        rewards: [N, G] outcome rewards, G >= 2.

    Returns:
        [N, G] advantages (unbiased: the baseline excludes the sample itself).
    """
    _check_groups(rewards, "RLOO")
    r = _float(rewards)
    g = r.shape[1]
    leave_one_out = (r.sum(dim=1, keepdim=True) - r) / (g - 1)
    return r - leave_one_out


def group_centred_batch_std_advantages(rewards: torch.Tensor, eps: float = 1e-6, ddof: int = 1) -> torch.Tensor:
    """``c = r - mean_g r``, ``A = c / (std_batch(c) + eps)``: REINFORCE++-baseline at response level.

    The batch std is over the centred values of all N*G responses, not over tokens as in the paper (whose
    form is the ``reinforce_pp_baseline`` preset). Contrast with Lite PPO, which divides the same ``c`` by the
    batch std of the raw rewards.

    Args:
        rewards: [N, G] outcome rewards, G >= 2.

    Returns:
        [N, G] advantages.
    """
    _check_groups(rewards, "group_centred_batch_std")
    r = _float(rewards)
    centred = r - r.mean(dim=1, keepdim=True)
    return centred / (_batch_std(centred, ddof) + eps)


def outcome_token_rewards(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Place each sample's scalar score on its last valid token.

    Args:
        scores: [B] outcome rewards.
        mask: [B, T] 1 for response tokens.

    Returns:
        [B, T] token rewards: ``scores[i]`` at the last position where ``mask[i] == 1``, 0 elsewhere; a row with
        an empty mask gets nothing.
    """
    valid = mask > 0
    b, t = valid.shape
    positions = torch.arange(t, device=valid.device).expand(b, t)
    last = torch.where(valid, positions, torch.full_like(positions, -1)).max(dim=1).values
    out = torch.zeros(b, t, dtype=_float(scores).dtype, device=scores.device)
    rows = torch.nonzero(last >= 0).squeeze(1)
    out[rows, last[rows]] = _float(scores)[rows]
    return out


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Return-to-go ``G_t = r_t + gamma * G_{next valid t}`` (REINFORCE returns).

    Args:
        token_rewards: [B, T] per-token rewards (outcome on the last token, minus any KL penalty).
        mask: [B, T] 1 for tokens that take part; masked positions are skipped, not treated as episode ends.
        gamma: discount per valid token.

    Returns:
        [B, T] returns, 0 off-mask.
    """
    r = _float(token_rewards)
    valid = mask > 0
    out = torch.zeros_like(r)
    running = torch.zeros(r.shape[0], dtype=r.dtype, device=r.device)
    for t in range(r.shape[1] - 1, -1, -1):
        # Masked positions carry ``running`` through untouched, which is what makes holes transparent.
        running = torch.where(valid[:, t], r[:, t] + gamma * running, running)
        out[:, t] = torch.where(valid[:, t], running, torch.zeros_like(running))
    return out


def gae_advantages(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
                   lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the valid tokens of each row.

    ``delta_t = r_t + gamma * V_{next} - V_t``, ``A_t = delta_t + gamma * lam * A_{next}``, where "next" is the
    next valid token; after the last valid token the episode terminates (``V_next = 0``, ``A_next = 0``).

    Args:
        token_rewards: [B, T] per-token rewards.
        values: [B, T] critic values V(s_t) (detached by the caller).
        mask: [B, T] 1 for action tokens; masked positions are skipped.
        gamma: discount.
        lam: GAE lambda.

    Returns:
        (advantages [B, T], returns [B, T] = advantages + values), both 0 off-mask.
    """
    r, v = _float(token_rewards), _float(values).to(_float(token_rewards).dtype)
    valid = mask > 0
    adv = torch.zeros_like(r)
    next_value = torch.zeros(r.shape[0], dtype=r.dtype, device=r.device)
    next_adv = torch.zeros_like(next_value)
    for t in range(r.shape[1] - 1, -1, -1):
        delta = r[:, t] + gamma * next_value - v[:, t]
        a = delta + gamma * lam * next_adv
        m = valid[:, t]
        # Skipped positions keep the successor's value and advantage for the previous valid token.
        next_value = torch.where(m, v[:, t], next_value)
        next_adv = torch.where(m, a, next_adv)
        adv[:, t] = torch.where(m, a, torch.zeros_like(a))
    returns = torch.where(valid, adv + v, torch.zeros_like(adv))
    return adv, returns


def gpg_advantages(rewards: torch.Tensor, mean_scope: NormScope = "group", std_scope: NormScope = "none",
                   eps: float = 1e-6, ddof: int = 1, running: RunningMoments | None = None) -> torch.Tensor:
    """GPG (arXiv 2504.02546): ``A = alpha * (r - M) / F_norm``, the scopes' normalisation times
    ``alpha = B / (B - M)`` (``gyre.algos.baselines.gpg_alpha``). The paper's best setting is group mean and
    ``F_norm = 1`` (std scope none); std scope group is its ``F_norm = std`` variant."""
    return normalize_rewards(rewards, mean_scope, std_scope, eps, ddof, running) * gpg_alpha(rewards)
