"""Policy losses users of verl and its recipes expect by name: Clip-Cov, KL-Cov, GMPO and SAPO.

Same contract as ``gyre.algos.policy_loss`` (listed in its ``POLICY_LOSSES`` table): [B, T] log-probs, advantages
broadcastable to [B, T], a ``PolicyLossOutput`` whose ``token_loss`` is aggregated afterwards. Off-mask
positions are selected away (``torch.where``), never multiplied, so NaN or inf in padding cannot reach the loss.

Papers:
- Clip-Cov and KL-Cov: Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
  Models" (arXiv 2505.22617). The entropy change of a step follows the covariance of a token's log-prob and
  its advantage, per token ``Cov_t = (log pi_t - mean log pi) (A_t - mean A)``, means over the batch's valid
  tokens. Clip-Cov takes the tokens whose Cov lies in (omega_low, omega_high), draws r*N of them at random and
  detaches them (no gradient), on top of the PPO clip; KL-Cov adds ``beta |log pi_theta - log pi_old|`` to
  the loss of the k*N tokens of largest Cov, on the unclipped ``-rho A``. The authors' recipes
  (PRIME-RL/Entropy-Mechanism-of-RL, ``recipe/dapo``): Clip-Cov r = 2e-4, omega = (1, 5) with clip ratio
  1; KL-Cov k = 2e-3 (7B; 2e-4 for 32B), beta = 1.
- GMPO: Zhao et al., "Geometric-Mean Policy Optimization" (arXiv 2507.20673): the geometric mean of the
  token-level clipped objectives, ``l_i = -A_i exp(mean_t sgn(A) min(sgn(A) d_t, sgn(A) clip(d_t, -e_low,
  e_high)))``, d_t the token log-ratio, clipped in log space (the paper's range (e^-0.4, e^0.4)).
- SAPO: Gao et al. (Qwen), "Soft Adaptive Policy Optimization" (arXiv 2511.20347): a soft gate instead of
  the clip, ``l_t = -f(rho_t) A_t``, ``f(x) = sigmoid(tau (x - 1)) 4 / tau``, tau = tau_pos where A > 0 and
  tau_neg elsewhere (the paper's 1.0 and 1.05). At rho = 1 its gradient equals the plain policy gradient.

Deviations:
- Clip-Cov / KL-Cov: the covariance and the token counts are taken over the tokens the loss sees at once
  (one micro-batch on one rank), as in the authors' code, not over the whole optimizer step: with several
  micro-batches the selection depends on how the batch is cut. Clip-Cov's random draw uses torch's global
  generator (trainer ranks seed it from run.seed) unless a generator is given; at least one token is chosen
  whenever a candidate exists (the authors' ``max(int(r N), 1)``).
- GMPO: like GSPO here, every token carries its sequence's loss in value and gets the gradient of its own
  log-ratio; aggregated with ``seq-mean-token-mean`` this is the paper's objective and gradient exactly. The
  advantage of a sequence is the mean of its token advantages (outcome advantages are constant per row).
- SAPO: the log-ratio is clamped to [-20, 20] before the exponent (the gate is flat there anyway), so one
  outlier token cannot overflow.
"""

from __future__ import annotations

import torch

from gyre.algos.loss_output import PolicyLossOutput, flag, zeros


def _select(valid: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``values`` where ``valid``, else 0 (a selection: padding may hold NaN or inf)."""
    return torch.where(valid, values, torch.zeros_like(values))


def _on_mask(mask: torch.Tensor, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(valid, and the inputs [B, T] with every off-mask entry replaced by 0) before any arithmetic: NaN in
    padding would otherwise come back through the backward pass as 0 * NaN."""
    valid = mask > 0
    adv = advantages.expand_as(logprobs)
    zero = torch.zeros_like(logprobs)
    return (valid, torch.where(valid, logprobs, zero), torch.where(valid, old_logprobs, zero),
            torch.where(valid, adv, torch.zeros_like(adv)))


def token_covariance(logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cui et al.'s per-token covariance term ``(log pi_t - mean log pi) (A_t - mean A)``, means over the
    valid tokens; detached, 0 off mask.

    Args:
        logprobs: [B, T] log pi_theta of the sampled tokens. advantages: broadcastable to [B, T].
        mask: [B, T] loss mask.
    """
    valid = mask > 0
    lp = logprobs.detach()
    adv = advantages.detach().expand_as(lp)
    count = valid.sum().clamp(min=1)
    lp_mean = _select(valid, lp).sum() / count
    adv_mean = _select(valid, adv).sum() / count
    return _select(valid, (lp - lp_mean) * (adv - adv_mean))


def _ppo_terms(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, clip_low: float,
               clip_high: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ratio, unclipped loss -rho A, clipped loss -clip(rho) A), all [B, T]."""
    ratio = torch.exp(logprobs - old_logprobs.detach())
    unclipped = -advantages * ratio
    return ratio, unclipped, -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)


def clip_cov_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                  clip_low: float = 0.2, clip_high: float = 0.2, select_ratio: float = 2e-4, cov_low: float = 1.0,
                  cov_high: float = 5.0, generator: torch.Generator | None = None) -> PolicyLossOutput:
    """Clip-Cov: the PPO clip loss, with a random ``select_ratio`` share of the valid tokens whose covariance
    lies strictly inside (cov_low, cov_high) (and that PPO did not clip already) detached: loss 0, no gradient.

    Args:
        logprobs, old_logprobs: [B, T]. advantages: broadcastable to [B, T]. mask: [B, T] loss mask.
        clip_low, clip_high: PPO's trust region (the authors use 1 and 1).
        select_ratio: r, the share of valid tokens detached (at least one when a candidate exists).
        cov_low, cov_high: the covariance band (omega_low, omega_high) candidates come from.
        generator: the random draw among candidates (None: torch's global generator).

    ``dropped`` flags the detached tokens; the clip flags are PPO's.
    """
    valid, logprobs, old_logprobs, advantages = _on_mask(mask, logprobs, old_logprobs, advantages)
    ratio, unclipped, clipped = _ppo_terms(logprobs, old_logprobs, advantages, clip_low, clip_high)
    loss = torch.maximum(unclipped, clipped)
    cov = token_covariance(logprobs, advantages, mask)
    candidates = valid & ~(clipped > unclipped).detach() & (cov > cov_low) & (cov < cov_high)
    where = torch.nonzero(candidates.reshape(-1)).squeeze(1)
    wanted = max(int(select_ratio * int(valid.sum())), 1)
    chosen = where[torch.randperm(where.numel(), generator=generator, device=where.device)[:wanted]]
    drop = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
    drop[chosen] = True
    drop = drop.view_as(valid)
    token_loss = torch.where(valid & ~drop, loss, torch.zeros_like(loss))
    r = ratio.detach()
    low = valid & (r < 1 - clip_low) & (advantages < 0)
    high = valid & (r > 1 + clip_high) & (advantages > 0)
    return PolicyLossOutput(token_loss=token_loss, ratio=r, clipped_low=flag(low, r), clipped_high=flag(high, r),
                            dropped=flag(drop, r))


def kl_cov_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                select_ratio: float = 2e-3, coef: float = 1.0) -> PolicyLossOutput:
    """KL-Cov: ``l_t = -rho_t A_t``, plus ``coef * |log pi_theta - log pi_old|`` on the ``select_ratio`` share of
    valid tokens (at least one) with the largest covariance. No clip.

    Args:
        logprobs, old_logprobs: [B, T]. advantages: broadcastable to [B, T]. mask: [B, T] loss mask.
        select_ratio: k, the share of valid tokens penalised.
        coef: beta, the weight of the penalty.

    ``penalised`` flags the penalised tokens.
    """
    valid, logprobs, old_logprobs, advantages = _on_mask(mask, logprobs, old_logprobs, advantages)
    log_ratio = logprobs - old_logprobs.detach()
    ratio = torch.exp(log_ratio)
    base = -advantages * ratio
    n_valid = int(valid.sum())
    cov = torch.where(valid, token_covariance(logprobs, advantages, mask), torch.full_like(ratio, -torch.inf))
    top = torch.topk(cov.reshape(-1), max(int(select_ratio * n_valid), 1) if n_valid else 0).indices
    picked = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
    picked[top] = True
    picked = picked.view_as(valid)
    loss = torch.where(picked, base + coef * log_ratio.abs(), base)
    r = ratio.detach()
    return PolicyLossOutput(token_loss=_select(valid, loss), ratio=r, clipped_low=zeros(r), clipped_high=zeros(r),
                            penalised=flag(picked, r))


def gmpo_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              clip_low: float = 0.4, clip_high: float = 0.4) -> PolicyLossOutput:
    """GMPO: every token of sequence i carries ``-A_i * exp(mean_t c_t)`` (the geometric mean of its clipped
    token ratios times its advantage), with ``c_t = d_t`` clipped to [-clip_low, clip_high] on the side that
    limits the objective (above for A > 0, below for A < 0), d_t = log pi_theta - log pi_old.

    Args:
        logprobs, old_logprobs: [B, T]. advantages: broadcastable to [B, T]. mask: [B, T] loss mask.
        clip_low, clip_high: bounds on the log-ratio (the paper's 0.4 and 0.4).

    ``ratio`` is the sequence's geometric-mean ratio; ``clipped_high`` / ``clipped_low`` flag tokens whose
    log-ratio was clipped with A > 0 / A < 0. Aggregate with ``seq-mean-token-mean`` for the paper's loss.
    """
    valid, logprobs, old_logprobs, advantages = _on_mask(mask, logprobs, old_logprobs, advantages)
    counts = valid.sum(dim=-1, keepdim=True).clamp(min=1)
    adv = advantages.sum(dim=-1, keepdim=True) / counts  # [B, 1]
    sign = torch.sign(adv)
    log_ratio = logprobs - old_logprobs.detach()
    bounded = torch.clamp(log_ratio, -clip_low, clip_high)
    clipped = sign * torch.minimum(sign * log_ratio, sign * bounded)
    seq = _select(valid, clipped).sum(dim=-1, keepdim=True).detach() / counts
    # Value exp(seq) at every token; d/d logp_t = exp(seq) * dc_t/dd_t, which, averaged over the tokens
    # (seq-mean-token-mean), is the gradient of exp(mean_t c_t).
    ratio = torch.exp(seq + clipped - clipped.detach())
    token_loss = _select(valid, -adv * ratio)
    was_clipped = valid & (clipped.detach() != log_ratio.detach())
    r = torch.exp(seq).expand_as(token_loss)
    return PolicyLossOutput(token_loss=token_loss, ratio=r, clipped_low=flag(was_clipped & (adv < 0), r),
                            clipped_high=flag(was_clipped & (adv > 0), r))


def sapo_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              tau_pos: float = 1.0, tau_neg: float = 1.05) -> PolicyLossOutput:
    """SAPO: ``l_t = -f(rho_t) A_t``, ``f(x) = sigmoid(tau (x - 1)) * 4 / tau``, tau = tau_pos where A > 0,
    tau_neg elsewhere. Its coefficient on ``-A grad log pi`` is ``4 s (1 - s) rho`` with s = sigmoid(tau (rho - 1)):
    1 on-policy, decaying smoothly as rho leaves 1 (faster for the larger tau).

    Args:
        logprobs, old_logprobs: [B, T]. advantages: broadcastable to [B, T]. mask: [B, T] loss mask.
        tau_pos, tau_neg: gate temperatures (> 0).
    """
    valid, logprobs, old_logprobs, adv = _on_mask(mask, logprobs, old_logprobs, advantages)
    ratio = torch.exp(torch.clamp(logprobs - old_logprobs.detach(), -20.0, 20.0))
    tau = torch.where(adv > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau
    r = ratio.detach()
    return PolicyLossOutput(token_loss=_select(valid, -gate * adv), ratio=r, clipped_low=zeros(r),
                            clipped_high=zeros(r))
