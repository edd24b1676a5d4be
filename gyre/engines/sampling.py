"""Token sampling for the HF rollout engine: logit filtering, the exponential race, per-position noise,
stop conditions.

Sampling noise is addressed by position: the noise that picks token t of sample i of a request is
drawn from a generator seeded with ``derive_seed(request.seed, i, t)``. A sample therefore does not
depend on which other rows share its batch, which engine serves it, whether its request was split
into one request per sample, or whether it was interrupted and continued from its tokens so far (up
to the floating-point effects of batching on the logits).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gyre.seeding import derive_seed
from gyre.types import SamplingParams


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k / top-p (nucleus) set to -inf. logits: [B, V] float32."""
    if top_k and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the mass strictly before it already reaches top_p (the top token always stays).
        drop_sorted = (probs.cumsum(dim=-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_tokens(logits: torch.Tensor, params: SamplingParams,
                  noise: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; returns (tokens [B], log-prob under the sampled distribution [B]).

    Sampling uses the exponential race: argmax_v p_v / E_v with E_v ~ Exp(1) draws v with probability
    p_v. ``noise`` [B, V] holds the E values (``position_noise``). Greedy decoding needs no noise.
    """
    logits = logits.float()
    if params.temperature == 0.0:
        tokens = logits.argmax(dim=-1)
        return tokens, torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
    logits = filter_logits(logits / params.temperature, params.top_k, params.top_p)
    logp = torch.log_softmax(logits, dim=-1)
    tokens = (logp - noise.clamp_min(1e-30).log()).argmax(dim=-1)  # a float32 draw of exactly 0 stays finite
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def position_noise(keys: Sequence[tuple[int, int, int]], vocab: int, device: torch.device) -> torch.Tensor:
    """Exp(1) noise [len(keys), vocab]; row j from a generator seeded by ``keys[j]`` = (request seed,
    sample index, response position)."""
    out = torch.empty((len(keys), vocab), device=device)
    generator = torch.Generator(device=device)
    for j, key in enumerate(keys):
        generator.manual_seed(derive_seed(*key))
        out[j].exponential_(generator=generator)
    return out


class StopChecker:
    """Decides whether a response just finished: EOS token, or a stop string completed by the last token."""

    def __init__(self, tokenizer, eos_ids: list[int]):
        self.tokenizer = tokenizer
        self.eos = set(eos_ids)

    def __call__(self, tokens: list[int], stop: tuple[str, ...], ignore_eos: bool = False) -> str | None:
        if tokens[-1] in self.eos and not ignore_eos:
            return "eos"
        if stop:
            # A stop string of k characters spans at most k tokens (every token decodes to >= 1 character),
            # so decoding that many trailing tokens (+1 for a token that straddles the boundary) suffices.
            window = max(len(s) for s in stop) + 1
            tail = self.tokenizer.decode(tokens[-window:], skip_special_tokens=True)
            if any(s in tail for s in stop):
                return "stop"
        return None
