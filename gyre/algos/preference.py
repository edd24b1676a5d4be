"""Pairwise preference losses: DPO and its common variants, per pair of (chosen, rejected) responses.

Inputs are each response's log-probability summed over its tokens, and its token count, under the policy
and (except SimPO) under the frozen reference. With h = (pi_c - pi_r) - (ref_c - ref_r), the difference of
the two log-ratios (over length-averaged log-probs where the variant says so), and s = log sigmoid:

- ``sigmoid``: DPO, Rafailov et al. 2023 (arXiv 2305.18290): -s(beta h). With ``label_smoothing`` eps > 0,
  conservative DPO (cDPO, Mitchell 2023): -(1 - eps) s(beta h) - eps s(-beta h).
- ``ipo``: IPO, Azar et al. 2023 (arXiv 2310.12036), Eq. 17: (h - 1 / (2 beta))^2, with h over
  length-averaged log-probs as TRL computes it.
- ``hinge``: SLiC, Zhao et al. 2023 (arXiv 2305.10425), in the reference-normalised form of RSO (Liu et al.
  2023, arXiv 2309.06657) that TRL calls ``hinge``: max(0, 1 - beta h).
- ``robust``: robust DPO, Chowdhury et al. 2024 (arXiv 2403.00409): the unbiased estimator under labels flipped
  with probability eps, (-(1 - eps) s(beta h) + eps s(-beta h)) / (1 - 2 eps).
- ``simpo``: SimPO, Meng et al. 2024 (arXiv 2405.14734): reference-free, on length-averaged log-probs a_c, a_r
  with a target margin gamma: -s(beta (a_c - a_r) - gamma) (label smoothing as for sigmoid, as TRL's CPO).

``rpo_alpha`` adds alpha times the chosen response's negative log-likelihood per token, -pi_c / |y_c| (RPO,
Pang et al. 2024, arXiv 2404.19733). Deviation: TRL averages that NLL over all chosen tokens of its batch;
here each pair's is averaged over its own tokens, so that the loss is a plain mean over pairs (the global
denominator is the pair count, whatever the micro-batches or ranks).

The implicit rewards (TRL's ``rewards/chosen`` and ``rewards/rejected``) are beta times each response's
log-ratio to the reference, over the same log-probs the variant uses; SimPO's are beta times the
length-averaged log-prob.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gyre.algos.specs import LENGTH_AVERAGED, PreferenceLossSpec


@dataclass(frozen=True)
class PairLogps:
    """Each pair's chosen and rejected response under one model, all [P]."""

    chosen: torch.Tensor
    """Log-prob of the chosen response, summed over its tokens."""
    rejected: torch.Tensor
    chosen_tokens: torch.Tensor
    """Tokens of the chosen response (its length)."""
    rejected_tokens: torch.Tensor

    def per_token(self) -> PairLogps:
        """The log-probs averaged over each response's tokens."""
        return PairLogps(self.chosen / self.chosen_tokens.clamp(min=1),
                         self.rejected / self.rejected_tokens.clamp(min=1), self.chosen_tokens, self.rejected_tokens)


@dataclass
class PreferenceLossOutput:
    """Per-pair results, all [P]; the step loss is their mean over every pair of the step."""

    losses: torch.Tensor
    chosen_rewards: torch.Tensor
    """Detached implicit reward of the chosen response."""
    rejected_rewards: torch.Tensor
    nll: torch.Tensor | None = None
    """Detached per-token NLL of the chosen response (with rpo_alpha)."""

    @property
    def accuracies(self) -> torch.Tensor:
        """1.0 where the chosen response's reward beats the rejected one's (TRL's rewards/accuracies)."""
        return (self.chosen_rewards > self.rejected_rewards).float()

    @property
    def margins(self) -> torch.Tensor:
        return self.chosen_rewards - self.rejected_rewards


def preference_loss(policy: PairLogps, reference: PairLogps | None,
                    spec: PreferenceLossSpec) -> PreferenceLossOutput:
    """Per-pair losses and implicit rewards of ``spec``'s variant (see the module docstring).

    Args:
        policy: the pairs' log-probs under the policy (with gradient).
        reference: the same under the reference model; None for a reference-free variant (SimPO), and
            ignored by one.
        spec: the variant and its coefficients.
    """
    pol = policy.per_token() if spec.loss_type in LENGTH_AVERAGED else policy
    if spec.needs_reference:
        if reference is None:
            raise ValueError(f"loss_type {spec.loss_type!r} needs the reference log-probs")
        ref = reference.per_token() if spec.loss_type in LENGTH_AVERAGED else reference
        chosen_ratio, rejected_ratio = pol.chosen - ref.chosen, pol.rejected - ref.rejected
    else:
        chosen_ratio, rejected_ratio = pol.chosen, pol.rejected
    losses = _pair_losses(chosen_ratio - rejected_ratio, spec)
    nll = None
    if spec.rpo_alpha is not None:
        per_token_nll = -policy.chosen / policy.chosen_tokens.clamp(min=1)
        losses = losses + spec.rpo_alpha * per_token_nll
        nll = per_token_nll.detach()
    return PreferenceLossOutput(losses, spec.beta * chosen_ratio.detach(), spec.beta * rejected_ratio.detach(), nll)


def _pair_losses(h: torch.Tensor, spec: PreferenceLossSpec) -> torch.Tensor:
    """The variant's loss of the log-ratio difference ``h`` [P]."""
    beta, eps = spec.beta, spec.label_smoothing
    if spec.loss_type == "ipo":
        return (h - 1.0 / (2.0 * beta)) ** 2
    if spec.loss_type == "hinge":
        return torch.relu(1.0 - beta * h)
    logits = beta * h - (spec.simpo_gamma if spec.loss_type == "simpo" else 0.0)
    if spec.loss_type == "robust":
        return (-(1.0 - eps) * F.logsigmoid(logits) + eps * F.logsigmoid(-logits)) / (1.0 - 2.0 * eps)
    return -(1.0 - eps) * F.logsigmoid(logits) - eps * F.logsigmoid(-logits)
