"""On-policy distillation: the student learns from a teacher's log-probs on the student's own samples.

With ``d_t = log pi_student(y_t) - log pi_teacher(y_t)`` on a token y_t sampled from the student, d_t is
the single-sample (k1) estimate of the per-token reverse KL, KL(pi_student || pi_teacher) at that state.
Three ways to use it (``algorithm.distill.mode``):

- ``pure``: the advantage of every token is ``-coef * d_t`` and the task reward is not used (ROLL
  ``is_pure_opd``; the per-token reward with discount 0 of Thinking Machines' "On-Policy Distillation"
  note, 2025, and the reverse-KL objective of GKD, Agarwal et al., arXiv 2306.13649, ICLR 2024, with
  student samples only). ROLL's pure mode applies no coefficient: its advantage is ``-d_t``, coef 1 here.
- ``advantage``: ``A_t - coef * d_t``, the RL advantage (after the estimator, before whitening) minus
  the scaled per-token KL (ROLL ``use_opd`` with ``opd_kl_coef``).
- ``loss``: the RL advantage is left alone and ``coef * agg(1/2 (log pi_theta - log pi_teacher)^2)`` is
  added to the loss. On samples from pi_theta its expected gradient is
  ``E[(log pi_theta - log pi_teacher) grad log pi_theta] = grad KL(pi_theta || pi_teacher)``, the
  reverse-KL gradient (Schulman, "Approximating KL Divergence", 2020: the k2 form); the k1 value as a
  loss would have expected gradient 0, and k3 gives the forward KL's.

Teacher and student must share a tokenizer: d_t compares the probabilities of the same token ids.
"""

from __future__ import annotations

import torch


def reverse_kl_tokens(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor,
                      mask: torch.Tensor) -> torch.Tensor:
    """Per-token ``d_t = log pi_student - log pi_teacher`` of the sampled tokens, 0 off ``mask``.

    Args:
        student_logprobs, teacher_logprobs: [B, T] log-probs of the sampled tokens (no gradient needed).
        mask: [B, T] 1 on the tokens that count.

    Returns:
        [B, T]; its masked mean estimates KL(pi_student || pi_teacher) per token. Off-mask positions are
        selected away (padding may hold inf or NaN log-probs).
    """
    d = student_logprobs.detach() - teacher_logprobs.detach()
    return torch.where(mask > 0, d, torch.zeros_like(d))


def distill_advantages(advantages: torch.Tensor, student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor,
                       mask: torch.Tensor, coef: float, pure: bool) -> torch.Tensor:
    """``-coef * d_t`` (``pure``) or ``advantages - coef * d_t`` on ``mask``, the advantages elsewhere (0
    when pure).

    Args:
        advantages: [B, T] the RL advantages (ignored when ``pure``).
        student_logprobs, teacher_logprobs, mask: as in ``reverse_kl_tokens``.
        coef: the distillation coefficient (ROLL ``opd_kl_coef``).
        pure: the teacher's signal alone (ROLL ``is_pure_opd``).
    """
    d = reverse_kl_tokens(student_logprobs, teacher_logprobs, mask)
    base = torch.zeros_like(d) if pure else advantages
    return base - coef * d


def distill_loss_tokens(logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token ``1/2 (log pi_theta - log pi_teacher)^2`` on ``mask`` (0, with zero gradient, elsewhere),
    differentiable in ``logprobs`` [B, T]; its expected gradient on the student's own samples is the
    reverse-KL gradient (module docstring). Aggregate it with ``aggregate_loss``."""
    # Select before squaring: padding may hold NaN, and the square's backward would multiply it by 0.
    diff = logprobs - teacher_logprobs.detach()
    d = torch.where(mask > 0, diff, torch.zeros_like(diff))
    return 0.5 * d.square()
