"""Attention-based credit: token scales from the policy's own attention ("Attention Illuminates LLM
Reasoning: The Preplan-and-Anchor Rhythm Enables Fine-Grained Policy Optimization", arXiv 2510.13554;
reference ``algorithms.md`` section 4.5).

One forward pass over prompt + response returns attention maps of ``layers`` evenly spaced layers of
the middle third (``middle_third_layers``). Per head (l, h) the span ``d = mean_{t in R} sum_{s<=t}
A[t, s] (t - s)`` over the response rows R; the ``head_quantile`` shortest-span heads are local, the
longest global, and each set's mean map is A_loc / A_glob. Token metrics:

- WAAD_t = sum_{s<=t} A_loc[t, s] min(t - s, W), W = ``waad_window`` (windowed average attention distance);
- FAI_s = mean_{t in T(s)} A_glob[t, s], T(s) = {t: s + near <= t <= min(N - 1, s + far)} (future
  attention influence; 0 when T(s) is empty).

Credit scales gamma_t (all ``1 + (gamma_amp - 1) x indicator``, top_q = share of tokens selected):
local_chunk: top-q of Delta_t = |WAAD_t - WAAD_{t+1}| (preplan points; Delta of the last token is 0);
global_anchor: top-q of FAI; coupled: the anchors T_glob = top-q of FAI, where an anchor t is *locally
dominated* (t in D) when WAAD_t <= tau_waad and max_{u in [t-k, t-1]} Delta_u >= tau_delta (k =
``backalloc_k``); a dominated anchor keeps (1 - alpha) of its amplification and gives alpha of it to
intro(t), the preceding WAAD peak (argmax of WAAD over [t-k, t-1]) [ours: the paper's wording]. Baselines:
random (a random top_q share) and entropy (top-q of the token entropy). Application: A~_t = gamma_t A_t
where A_t >= 0, A_t unchanged where A_t < 0 (gamma is a constant: no gradient).

**tau_waad, tau_delta and alpha were not published.** gyre's defaults, chosen by us: tau_waad = 2
(tokens: an anchor whose local attention reaches about two tokens back), tau_delta = 1 (a WAAD jump of
one token of distance just before it) and alpha = 0.5 (half the amplification moves back). Which
attention row stands for token t is also ours: row t itself (the token's own position, whose query
attends to the tokens before it).
"""

from __future__ import annotations

import math

import torch

from gyre.algos.specs import ATTENTION_STRATEGIES, CreditSpec


def middle_third_layers(num_layers: int, count: int) -> list[int]:
    """``count`` evenly spaced layer indices from floor(L/3) to floor(2L/3) (fewer when L is small)."""
    lo, hi = num_layers // 3, (2 * num_layers) // 3
    if count == 1:
        return [(lo + hi) // 2]
    return sorted({round(lo + i * (hi - lo) / (count - 1)) for i in range(count)})


def _distance(n: int, like: torch.Tensor) -> torch.Tensor:
    """[n, n] t - s (0 above the diagonal)."""
    pos = torch.arange(n, device=like.device, dtype=like.dtype)
    return (pos[:, None] - pos[None, :]).clamp(min=0)


def head_spans(attn: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """[K] span of each head: mean over the ``rows`` (bool [N], the response) of sum_s A[t, s] (t - s).

    Args:
        attn: [K, N, N] attention maps of K heads (row t attends to columns s <= t).
    """
    per_row = (attn * _distance(attn.shape[-1], attn)).sum(-1)  # [K, N]
    return per_row[:, rows].mean(-1)


def split_heads(spans: torch.Tensor, quantile: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(local, global) head indices: the ceil(quantile K) shortest and longest spans."""
    k = max(1, math.ceil(quantile * spans.numel()))
    order = torch.argsort(spans, stable=True)
    return order[:k], order[-k:]


def waad(local: torch.Tensor, window: int) -> torch.Tensor:
    """[N] WAAD_t = sum_{s<=t} A_loc[t, s] min(t - s, window), from the mean local map [N, N]."""
    return (local * _distance(local.shape[-1], local).clamp(max=window)).sum(-1)


def fai(glob: torch.Tensor, near: int, far: int) -> torch.Tensor:
    """[N] FAI_s = mean over t in [s + near, min(N - 1, s + far)] of A_glob[t, s]; 0 if that set is empty."""
    n = glob.shape[-1]
    gap = _distance(n, glob)  # [t, s] = t - s where t >= s
    window = (gap >= near) & (gap <= far)
    count = window.sum(0)  # per column s
    total = torch.where(window, glob, torch.zeros_like(glob)).sum(0)
    return torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(total))


def token_metrics(attn: torch.Tensor, rows: torch.Tensor, spec: CreditSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """(WAAD [N], FAI [N]) of one sequence from the [K, N, N] maps of its sampled layers' heads."""
    local, glob = split_heads(head_spans(attn, rows), spec.head_quantile)
    return waad(attn[local].mean(0), spec.waad_window), fai(attn[glob].mean(0), spec.fai_near, spec.fai_far)


def top_quantile(x: torch.Tensor, q: float) -> torch.Tensor:
    """bool [n]: the ceil(q n) largest entries (earlier first among ties)."""
    n = x.numel()
    chosen = torch.zeros(n, dtype=torch.bool, device=x.device)
    if n:
        chosen[torch.argsort(-x, stable=True)[:math.ceil(q * n)]] = True
    return chosen


def waad_jumps(w: torch.Tensor) -> torch.Tensor:
    """[n] Delta_t = |WAAD_t - WAAD_{t+1}|, 0 for the last token."""
    d = torch.zeros_like(w)
    d[:-1] = (w[:-1] - w[1:]).abs()
    return d


def _amplify(selected: torch.Tensor, spec: CreditSpec) -> torch.Tensor:
    return 1.0 + (spec.gamma_amp - 1.0) * selected.to(torch.float32)


def coupled_scales(w: torch.Tensor, f: torch.Tensor, spec: CreditSpec) -> torch.Tensor:
    """[n] gamma of the coupled rhythm from the response's WAAD ``w`` and FAI ``f`` (module docstring)."""
    n, k, extra = w.numel(), spec.backalloc_k, spec.gamma_amp - 1.0
    anchors, jumps = top_quantile(f, spec.top_q), waad_jumps(w)
    gamma = torch.ones(n, dtype=torch.float32, device=w.device)
    for t in torch.nonzero(anchors).flatten().tolist():
        lo = max(0, t - k)
        dominated = t > 0 and w[t] <= spec.tau_waad and jumps[lo:t].max() >= spec.tau_delta
        if not dominated:
            gamma[t] += extra
            continue
        gamma[t] += (1.0 - spec.alpha) * extra
        gamma[lo + int(torch.argmax(w[lo:t]))] += spec.alpha * extra
    return gamma


def credit_scales(spec: CreditSpec, n: int, w: torch.Tensor | None = None, f: torch.Tensor | None = None,
                  entropy: torch.Tensor | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """[n] gamma of one response's n tokens under ``spec.strategy``; the inputs it needs are that
    response's WAAD ``w`` and FAI ``f`` (attention strategies), ``entropy`` or ``generator`` (random)."""
    s = spec.strategy
    if s == "none":
        return torch.ones(n)
    if s == "random":
        return _amplify(top_quantile(torch.rand(n, generator=generator), spec.top_q), spec)
    if s == "entropy":
        return _amplify(top_quantile(entropy, spec.top_q), spec)
    if s == "local_chunk":
        return _amplify(top_quantile(waad_jumps(w), spec.top_q), spec)
    if s == "global_anchor":
        return _amplify(top_quantile(f, spec.top_q), spec)
    if s == "coupled":
        return coupled_scales(w, f, spec)
    raise ValueError(f"unknown credit strategy {s!r}; use none, random, entropy, {', '.join(ATTENTION_STRATEGIES)}")


def random_scales(mask: torch.Tensor, spec: CreditSpec, generator: torch.Generator) -> torch.Tensor:
    """[B, T] gamma of the random baseline: a random top_q share of each row's ``mask`` tokens, 1 elsewhere."""
    out = torch.ones(mask.shape, dtype=torch.float32)
    for row in range(mask.shape[0]):
        idx = torch.nonzero(mask[row] > 0).flatten()
        out[row, idx] = credit_scales(spec, idx.numel(), generator=generator)
    return out


def apply_credit(advantages: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """A~ = gamma A where A >= 0, A elsewhere (same shapes; gamma carries no gradient)."""
    return torch.where(advantages >= 0, gamma.detach() * advantages, advantages)
