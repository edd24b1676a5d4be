"""Per-token log-probabilities and entropies from logits (pure torch).

Log-probs are taken at the sampling temperature, ``log softmax(logits / T)``, over the full vocabulary.
The rollout engine reports the log-prob of the distribution it actually sampled from (after top-k /
top-p truncation); with truncation on, the two differ by the log of the kept mass, which the pipeline
reports as the train-inference mismatch.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


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


def chunked_next_token_stats(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                             targets: torch.Tensor, temperature: float, chunk_tokens: int,
                             entropy_at: torch.Tensor | None = None) -> torch.Tensor:
    """log p(targets) (and the entropy) at every position, projecting ``hidden`` to the vocabulary
    ``chunk_tokens`` positions at a time, so only [chunk_tokens, V] logits exist at once.

    Under autograd each chunk is checkpointed: the backward pass recomputes the chunk's logits instead
    of keeping them, so the saved state is the hidden states (which the output layer keeps anyway).

    Args:
        hidden: [..., H] final hidden states (what the model's output layer receives).
        weight, bias: the output layer's [V, H] weight and optional [V] bias.
        targets: [...] the token whose log-prob is wanted at each position.
        temperature: log-probs of softmax(logits / temperature), as ``token_logprobs``.
        entropy_at: [...] bool, where the entropy of that distribution is wanted too (0 elsewhere);
            None: no entropies.
    Returns:
        [..., 2] float32 (log-prob, entropy) with ``entropy_at``, else [..., 1].
    """
    shape = targets.shape
    flat_h, flat_t = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    flat_e = entropy_at.reshape(-1) if entropy_at is not None else None
    outs = []
    for start in range(0, flat_t.shape[0], chunk_tokens):
        part = slice(start, start + chunk_tokens)
        piece = (flat_h[part], weight, bias, flat_t[part], flat_e[part] if flat_e is not None else None)
        if torch.is_grad_enabled():
            outs.append(checkpoint(_chunk_stats, *piece, temperature, use_reentrant=False, preserve_rng_state=False))
        else:
            outs.append(_chunk_stats(*piece, temperature))
    return torch.cat(outs).reshape(*shape, -1)


def _chunk_stats(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                 entropy_at: torch.Tensor | None, temperature: float) -> torch.Tensor:
    logits = torch.nn.functional.linear(hidden, weight, bias)
    lp = token_logprobs(logits[None], targets[None], temperature)[0]
    if entropy_at is None:
        return lp[:, None]
    ent = torch.zeros_like(lp)
    ent[entropy_at] = entropy_from_logits(logits[entropy_at][None], temperature)[0]
    return torch.stack([lp, ent], dim=-1)
