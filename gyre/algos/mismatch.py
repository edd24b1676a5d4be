"""Train-inference mismatch correction: IS weights, filters and metrics (reference ``algorithms.md`` section 7).

The trainer's log-probs of the sampled tokens (``old_logprobs``, log pi_old) differ from the sampler's
(``behaviour_logprobs``, log mu) because of kernels, precision and asynchronous staleness. With
``delta_t = log pi_old - log mu`` the log-weight is built at one of four levels:

- token: ``delta_t``;
- segment: masked mean of delta over the token's segment (a contiguous model span between environment messages);
- geometric: masked mean of delta over the row;
- sequence: masked sum of delta over the row.

Direction: every weight, ratio and ratio bound here is pi_old / mu, the trainer over the sampler (ROLL's
and verl's ``rollout_is`` direction). verl's k1 rejection (``rollout_rs: token_k1`` and the ``seq_*_k1``
modes) bounds the inverse, mu / pi_old: its thresholds [lo, hi] are [1 / hi, 1 / lo] here.

Two more corrections from verl's rollout correction (``verl/trainer/ppo/rollout_corr_helper.py``,
``docs/algo/rollout_corr.md``):

- batch-normalised weights (``normalize_weights``, verl ``rollout_is_batch_normalize``): the truncated weights
  divided by their mean over the batch's units (tokens; segments; rows for the geometric and sequence
  levels), so their mean is 1 and the loss keeps its scale whatever the mismatch;
- rejection by divergence (``divergence_filter``, verl ``rollout_rs`` ``token_k2``, ``seq_sum_k3``, ...): with
  tokens sampled from mu and ``delta = log pi_old - log mu``, k2 = delta^2 / 2 and k3 = exp(delta) - 1 - delta
  estimate KL(mu || pi_old) per token (Schulman's estimators with mu as the sampling distribution; k3 is
  unbiased and >= 0). A token, or a whole row by the sum, mean or max of its tokens' estimates, leaves the
  loss when the estimate exceeds a threshold: one bound (the estimates are >= 0), where the ratio filter
  needs two.

Source: ROLL ``train_infer_correction`` (code, no paper). Related: Yao et al. 2025 (blog, truncated
``pi_train / pi_infer``); IPA's chunk mismatch mask ("Let It Flow", arXiv 2512.24873) is the segment level here.

Decisions [gyre]: the diff filter (p_old - p_mu) at segment/geometric/sequence level uses the masked *mean* of the
per-token differences over the unit (a sum of probability differences is not a probability difference), so the
geometric and sequence diff filters coincide. Off-mask positions never influence any output: values are selected
with ``torch.where`` (padding may hold inf or NaN) and off-mask segment ids are ignored.

Shapes: B samples, T response tokens; every tensor argument is [B, T]. All outputs are detached.
"""

from __future__ import annotations

import math

import torch

from gyre.algos.specs import MismatchLevel
from gyre.algos.tables import Registry

_LEVELS = ("token", "segment", "geometric", "sequence")


def _masked(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``values`` where ``valid``, else 0 (select, not multiply, so NaN/inf padding cannot leak)."""
    return torch.where(valid, values, torch.zeros_like(values))


def _segment_index(valid: torch.Tensor, segments: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Compact id in [0, K) of each token's (row, segment) pair, [B*T], and K.

    Off-mask tokens are mapped to segment 0 of their row; callers give them weight 0. ``torch.unique`` makes
    sparse or negative segment ids cost nothing extra.
    """
    seg = torch.where(valid, segments.long(), torch.zeros_like(segments, dtype=torch.long))
    rows = torch.arange(seg.shape[0], device=seg.device).unsqueeze(1).expand_as(seg)
    pairs = torch.stack([rows.reshape(-1), seg.reshape(-1)], dim=1)
    unique, inverse = torch.unique(pairs, dim=0, return_inverse=True)
    return inverse, unique.shape[0]


def _segment_reduce(values: torch.Tensor, valid: torch.Tensor, segments: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-segment masked mean of ``values``, via scatter_add over flattened (row, segment) ids.

    Returns:
        (per-token segment mean [B, T] (0 off mask), per-segment means [K], per-segment valid counts [K]).
    """
    inverse, k = _segment_index(valid, segments)
    weight = valid.reshape(-1).to(values.dtype)
    sums = torch.zeros(k, dtype=values.dtype, device=values.device)
    sums.scatter_add_(0, inverse, _masked(values, valid).reshape(-1))
    counts = torch.zeros(k, dtype=values.dtype, device=values.device).scatter_add_(0, inverse, weight)
    means = sums / counts.clamp(min=1)
    return _masked(means[inverse].view_as(values), valid), means, counts


def _unit_reduce(values: torch.Tensor, valid: torch.Tensor, level: MismatchLevel,
                 segments: torch.Tensor | None) -> torch.Tensor:
    """Reduce per-token ``values`` over each token's unit at ``level`` and broadcast back; [B, T], 0 off mask."""
    if level == "token":
        return _masked(values, valid)
    if level == "segment" and segments is not None:
        return _segment_reduce(values, valid, segments)[0]
    if level in ("segment", "geometric", "sequence"):
        # segment without ids: the whole response is one segment, i.e. the geometric mean.
        total = _masked(values, valid).sum(dim=-1, keepdim=True)
        if level != "sequence":
            total = total / valid.sum(dim=-1, keepdim=True).clamp(min=1)
        return _masked(total.expand_as(values), valid)
    raise ValueError(f"unknown mismatch level {level!r}; use one of {_LEVELS}")


def mismatch_log_ratio(old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor,
                       level: MismatchLevel, segments: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token log-weight at ``level``: token delta_t, segment or row mean of delta, or row sum.

    Args:
        old_logprobs: [B, T] log pi_old (trainer). behaviour_logprobs: [B, T] log mu (sampler).
        mask: [B, T] loss mask. segments: [B, T] int segment id per token (read only where mask = 1), or None
            for one segment per row.

    Returns:
        [B, T] detached; 0 where mask = 0.
    """
    valid = mask > 0
    delta = old_logprobs.detach() - behaviour_logprobs.detach()
    return _unit_reduce(delta, valid, level, segments)


def importance_weights(old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor,
                       level: MismatchLevel, upper_bound: float = 1.2,
                       segments: torch.Tensor | None = None) -> torch.Tensor:
    """Truncated IS weight ``min(exp(log-weight at level), upper_bound)`` multiplying the per-token PG loss.

    Args: as :func:`mismatch_log_ratio`; ``upper_bound`` (> 0) is ROLL ``is_weight.upper_bound``.

    Returns:
        [B, T] detached; 1.0 where mask = 0.
    """
    if upper_bound <= 0:
        raise ValueError(f"upper_bound must be > 0 (got {upper_bound})")
    log_w = mismatch_log_ratio(old_logprobs, behaviour_logprobs, mask, level, segments)
    # Clamp before exp (a long sequence-level sum would overflow to inf), then again after: exp(log(1.2)) can
    # round above 1.2.
    weight = torch.exp(log_w.clamp(max=math.log(upper_bound))).clamp(max=upper_bound)
    return torch.where(mask > 0, weight, torch.ones_like(weight))


def mismatch_filter(old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor,
                    level: MismatchLevel, ratio_low: float | None = 0.8, ratio_high: float | None = 1.2,
                    diff_low: float | None = None, diff_high: float | None = None,
                    segments: torch.Tensor | None = None) -> torch.Tensor:
    """Keep-mask removing tokens whose unit (token, segment or row at ``level``) is too far off-policy.

    A unit is dropped when its ratio ``exp(log-weight at level)`` = pi_old / mu (trainer over sampler, not
    mu / pi_old) is outside [ratio_low, ratio_high], or, for
    each diff bound given, when its probability difference ``p_old - p_mu`` (per token, or the masked mean of
    the per-token differences over the segment/row) is outside [diff_low, diff_high]. A bound of None is off.

    Args: as :func:`mismatch_log_ratio`, plus the bounds (ROLL ``filters``: ratio 0.8/1.2, diff -0.2/0.2).

    Returns:
        [B, T] float keep-mask (old_logprobs' dtype); always 0 where mask = 0.
    """
    valid = mask > 0
    old, behaviour = old_logprobs.detach(), behaviour_logprobs.detach()
    keep = valid.clone()
    if ratio_low is not None or ratio_high is not None:
        ratio = torch.exp(mismatch_log_ratio(old, behaviour, mask, level, segments))
        if ratio_low is not None:
            keep &= ratio >= ratio_low
        if ratio_high is not None:
            keep &= ratio <= ratio_high
    if diff_low is not None or diff_high is not None:
        diff_level = "geometric" if level == "sequence" else level
        diff = _unit_reduce(torch.exp(old) - torch.exp(behaviour), valid, diff_level, segments)
        if diff_low is not None:
            keep &= diff >= diff_low
        if diff_high is not None:
            keep &= diff <= diff_high
    return keep.to(old.dtype)


def mismatch_metrics(old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor,
                     segments: torch.Tensor | None = None) -> dict[str, float]:
    """Mismatch statistics for logging (and for a run's mismatch budget).

    ``mismatch/ratio_{token,segment,geometric,sequence}`` is the mean ratio over the *units* of that level
    (tokens, segments, non-empty rows); segments default to whole rows, so ``ratio_segment`` then equals
    ``ratio_geometric``. Also ``mismatch/abs_logratio`` (token mean of |delta|), ``mismatch/ratio_max_token``
    and ``mismatch/prob_diff_token`` (token mean of p_old - p_mu). Computed in float64 so the sequence ratio
    overflows only past exp(709). Every value is 0.0 when the mask is empty.

    Args:
        old_logprobs, behaviour_logprobs, mask: [B, T]. segments: optional [B, T] int segment ids.
    """
    valid = mask > 0
    old, behaviour = old_logprobs.detach().double(), behaviour_logprobs.detach().double()
    delta = _masked(old - behaviour, valid)
    n_tokens = valid.sum().clamp(min=1)
    rows = valid.any(dim=-1)
    n_rows = rows.sum().clamp(min=1)
    row_sum = delta.sum(dim=-1)
    row_mean = row_sum / valid.sum(dim=-1).clamp(min=1)
    segs = segments if segments is not None else torch.zeros_like(delta, dtype=torch.long)
    _, seg_means, seg_counts = _segment_reduce(delta, valid, segs)
    seg_valid = seg_counts > 0
    token_ratio = _masked(torch.exp(delta), valid)
    out = {
        "mismatch/ratio_token": token_ratio.sum() / n_tokens,
        "mismatch/ratio_segment": _masked(torch.exp(seg_means), seg_valid).sum() / seg_valid.sum().clamp(min=1),
        "mismatch/ratio_geometric": _masked(torch.exp(row_mean), rows).sum() / n_rows,
        "mismatch/ratio_sequence": _masked(torch.exp(row_sum), rows).sum() / n_rows,
        "mismatch/abs_logratio": delta.abs().sum() / n_tokens,
        "mismatch/ratio_max_token": token_ratio.max() if valid.any() else token_ratio.new_zeros(()),
        "mismatch/prob_diff_token": _masked(torch.exp(old) - torch.exp(behaviour), valid).sum() / n_tokens,
    }
    return {k: float(v) for k, v in out.items()}


def normalize_weights(weights: torch.Tensor, mask: torch.Tensor, level: MismatchLevel,
                      segments: torch.Tensor | None = None) -> torch.Tensor:
    """Importance weights divided by their mean over the batch's units, so that mean is 1 (verl
    ``rollout_is_batch_normalize``; applied after truncation, which it keeps in proportion).

    The units are those the weight was built for: tokens at token level, segments at segment level, rows at
    geometric and sequence level (each row one weight, however long).

    Args:
        weights: [B, T] importance weights (``importance_weights``), constant over each unit.
        mask: [B, T] the tokens they apply to. level, segments: as :func:`importance_weights`.

    Returns:
        [B, T] detached; 1.0 where mask = 0, and unchanged weights when the mean is not positive.
    """
    valid = mask > 0
    w = _masked(weights.detach(), valid)
    if level == "token":
        mean = w.sum() / valid.sum().clamp(min=1)
    elif level == "segment" and segments is not None:
        _, unit_means, counts = _segment_reduce(w, valid, segments)
        mean = _masked(unit_means, counts > 0).sum() / (counts > 0).sum().clamp(min=1)
    elif level in ("segment", "geometric", "sequence"):
        rows = valid.any(dim=-1)
        per_row = w.sum(dim=-1) / valid.sum(dim=-1).clamp(min=1)
        mean = _masked(per_row, rows).sum() / rows.sum().clamp(min=1)
    else:
        raise ValueError(f"unknown mismatch level {level!r}; use one of {_LEVELS}")
    scaled = w / torch.where(mean > 0, mean, torch.ones_like(mean))
    return torch.where(valid, scaled, torch.ones_like(scaled))


def _k2(delta: torch.Tensor) -> torch.Tensor:
    return 0.5 * delta.square()


def _k3(delta: torch.Tensor) -> torch.Tensor:
    # expm1 keeps the small values exact (no 1 - 1 cancellation); a huge delta overflows to inf, which
    # exceeds every threshold: the token is rejected, as it should be.
    return torch.expm1(delta) - delta


DIVERGENCES: Registry = Registry("mismatch divergence", {
    "k2": _k2,
    "k3": _k3,
})
"""Per-token estimates of KL(mu || pi_old) from ``delta = log pi_old - log mu`` on tokens sampled from mu:
``delta [B, T] -> estimate [B, T]``."""


def _row_max(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    top = torch.where(valid, values, torch.full_like(values, -torch.inf)).amax(dim=-1, keepdim=True)
    return torch.where(valid.any(dim=-1, keepdim=True), top, torch.zeros_like(top))


DIVERGENCE_LEVELS: Registry = Registry("divergence level", {
    "token": lambda values, valid: values,
    "sequence_sum": lambda values, valid: _masked(values, valid).sum(dim=-1, keepdim=True),
    "sequence_mean": lambda values, valid: (_masked(values, valid).sum(dim=-1, keepdim=True)
                                            / valid.sum(dim=-1, keepdim=True).clamp(min=1)),
    "sequence_max": _row_max,
})
"""How per-token divergences become the statistic a token is judged by: its own (token), or its row's sum,
mean or max (verl ``seq_sum``, ``seq_mean``, ``seq_max``), shared by every token of the row:
``(per-token values [B, T], valid [B, T]) -> [B, T] or [B, 1]``."""


def divergence_filter(old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor,
                      kind: str = "k3", level: str = "token", threshold: float = 0.01) -> torch.Tensor:
    """Keep-mask rejecting tokens (or whole rows) whose divergence estimate exceeds ``threshold``.

    Args:
        old_logprobs: [B, T] log pi_old (trainer). behaviour_logprobs: [B, T] log mu (sampler).
        mask: [B, T] loss mask.
        kind: a name of ``DIVERGENCES`` (k2, k3).
        level: a name of ``DIVERGENCE_LEVELS`` (token, sequence_sum, sequence_mean, sequence_max).
        threshold: the largest estimate kept (> 0).

    Returns:
        [B, T] float keep-mask (old_logprobs' dtype); always 0 where mask = 0.
    """
    if threshold <= 0:
        raise ValueError(f"the divergence threshold must be > 0 (got {threshold})")
    valid = mask > 0
    delta = _masked(old_logprobs.detach() - behaviour_logprobs.detach(), valid)
    per_token = _masked(DIVERGENCES.get(kind)(delta), valid)
    stat = DIVERGENCE_LEVELS.get(level)(per_token, valid).expand_as(per_token)
    return (valid & (stat <= threshold)).to(old_logprobs.dtype)
