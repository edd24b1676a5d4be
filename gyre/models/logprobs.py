"""Per-token log-probabilities and entropies from logits (pure torch).

Log-probs are taken at the sampling temperature, ``log softmax(logits / T)``, over the full vocabulary.
The rollout engine reports the log-prob of the distribution it actually sampled from (after top-k /
top-p truncation); with truncation on, the two differ by the log of the kept mass, which the pipeline
reports as the train-inference mismatch.
"""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(tokens) under softmax(logits / temperature).

    Args:
        logits: [B, T, V] (any float dtype; computed in float32).
        tokens: [B, T] token ids whose log-probs are wanted.
    Returns:
        [B, T] float32.
    """
    logits = logits.float()
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    picked = torch.gather(logits, -1, tokens.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) per position: [B, T, V] -> [B, T] float32."""
    logits = logits.float()
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)
