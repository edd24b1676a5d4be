"""The records and names of the smaller algorithm families, without torch.

The config reads these (``gyre config`` and ``gyre check`` never import torch); the tensor functions that
take them stay in their modules, which import them from here: the KL estimators (``kl``), the loss
aggregations (``aggregation``), on-policy distillation (``distill``), attention-based credit
(``attention_credit``), the mismatch divergences (``mismatch``), the preference losses (``preference``) and
AsyPPO's critics (``asyppo``). Where a module keeps a ``Registry`` of functions (``AGGREGATIONS``,
``DIVERGENCES``, ``DIVERGENCE_LEVELS``), the ``Literal`` here lists the same names for the config, and
``tests/algos/test_tables.py`` checks the two agree. The tables of the larger families, with the knobs of
each variant, are ``loss_table`` and ``estimator_table``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from gyre.algos.tables import knob

# ---- KL to the reference (gyre.algos.kl) ------------------------------------------------------------------

KLKind = Literal["k1", "abs", "k2", "k3"]

KL_CLAMP = 10.0
"""Default bound of every per-token KL estimate: [-10, 10]."""


@dataclass(frozen=True)
class KLSpec:
    """KL to the reference model (``gyre.algos.kl``): a term of the policy loss (GRPO), a per-token penalty
    in the rewards (PPO, REINFORCE++), or both; a coefficient > 0 creates the reference role. The trainers
    read the loss term's keys, the driver's advantage stage the penalty's; both the clamp."""

    loss_coef: float = knob(0.0, ge=0)
    """KL-to-reference loss term (GRPO style); > 0 creates the reference role."""
    loss_estimator: KLKind = "k3"
    """The KL estimator of that term (its value)."""
    loss_grad_estimator: KLKind | None = None
    """Straight-through KL: the term keeps loss_estimator's value and takes this estimator's gradient
    (verl's "k1+" / "k3+" are k2 here: the gradient of KL(pi || pi_ref) in expectation); None: the value's
    own."""
    reward_coef: float = knob(0.0, ge=0)
    """Per-token KL penalty subtracted from the rewards (PPO / REINFORCE++ style); > 0 creates the reference."""
    reward_estimator: KLKind = "k1"
    """The per-token KL estimate subtracted from the token rewards when reward_coef > 0 (clamped by clamp)."""
    target: float | None = knob(None, gt=0)
    """Adaptive KL coefficient (arXiv 1909.08593) aiming at this per-token KL; None keeps reward_coef fixed."""
    horizon: int = knob(10000, gt=0)
    """Adaptive KL (target): the horizon of the proportional controller, in samples (arXiv 1909.08593)."""
    clamp: float | None = knob(KL_CLAMP, gt=0, le=1e6)
    """Every per-token KL estimate, of the KL loss and of the KL reward penalty, any estimator, is clamped
    to [-clamp, clamp] (verl's low_var_kl clamps k3 to [-10, 10]); a clamped token's KL gradient is 0,
    never of the wrong sign. k3 = 10 at log-ratios log pi - log pi_ref of about -2.61 and 11. None keeps
    the exact estimate (k3 then overflows to inf below a log-ratio of about -88 in float32)."""


# ---- loss aggregation (gyre.algos.aggregation.AGGREGATIONS) -------------------------------------------------

AggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm", "token-sum"]

# ---- on-policy distillation (gyre.algos.distill) ------------------------------------------------------------

DistillMode = Literal["pure", "advantage", "loss"]

# ---- train-inference mismatch (gyre.algos.mismatch) -------------------------------------------------------

MismatchLevel = Literal["token", "segment", "geometric", "sequence"]
Divergence = Literal["k2", "k3"]
"""The names of ``mismatch.DIVERGENCES``."""
DivergenceLevel = Literal["token", "sequence_sum", "sequence_mean", "sequence_max"]
"""The names of ``mismatch.DIVERGENCE_LEVELS``."""

# ---- AsyPPO's critics (gyre.algos.asyppo) -----------------------------------------------------------------

ValueAggregation = Literal["mean", "min"]
DataDivision = Literal["group_response_split", "prompt_shard"]

# ---- attention-based credit (gyre.algos.attention_credit) -------------------------------------------------

CreditStrategy = Literal["none", "random", "entropy", "local_chunk", "global_anchor", "coupled"]
ATTENTION_STRATEGIES = ("local_chunk", "global_anchor", "coupled")
"""The strategies that need the policy's attention maps (entropy needs only its logits)."""


@dataclass(frozen=True)
class CreditSpec:
    """The knobs of attention-based credit (``algorithm.credit``); the config section is derived from it."""

    strategy: CreditStrategy = "none"
    """none (off), random, entropy, local_chunk, global_anchor or coupled (the paper's best)."""
    gamma_amp: float = knob(1.5, gt=0)
    """Amplification of a selected token's non-negative advantage (the paper's 1.5)."""
    top_q: float = knob(0.4, gt=0, le=1)
    """Share of each response's tokens selected (top 40% in the paper)."""
    head_quantile: float = knob(0.3, gt=0, le=0.5)
    """Share of heads counted local (shortest spans) and global (longest spans)."""
    layers: int = knob(5, ge=1)
    """Attention maps are read from this many evenly spaced layers of the middle third."""
    waad_window: int = knob(10, ge=1)
    """W of WAAD: attention distances are capped at this many tokens."""
    fai_near: int = knob(10, ge=1)
    """FAI counts attention from tokens at least this far after s..."""
    fai_far: int = knob(50, ge=1)
    """...and at most this far."""
    backalloc_k: int = knob(3, ge=1)
    """coupled: how far back (tokens) a WAAD jump or peak makes an anchor locally dominated."""
    alpha: float = knob(0.5, ge=0, le=1)
    """coupled: share of a dominated anchor's amplification moved to its introducing token (unpublished; ours)."""
    tau_waad: float = knob(2.0, ge=0)
    """coupled: an anchor is locally dominated only if its WAAD is at most this (unpublished; ours)."""
    tau_delta: float = knob(1.0, ge=0)
    """coupled: ...and a WAAD jump of at least this precedes it within backalloc_k tokens (unpublished; ours)."""

    @property
    def needs_attention(self) -> bool:
        return self.strategy in ATTENTION_STRATEGIES


# ---- preference losses (gyre.algos.preference) ------------------------------------------------------------

PreferenceLossType = Literal["sigmoid", "ipo", "hinge", "robust", "simpo"]
LENGTH_AVERAGED: tuple[str, ...] = ("ipo", "simpo")
"""Variants that compare length-averaged log-probs instead of sums."""
REFERENCE_FREE: tuple[str, ...] = ("simpo",)
"""Variants that need no reference model."""


@dataclass(frozen=True)
class PreferenceLossSpec:
    """Which variant and its coefficients (the ``dpo`` config section's)."""

    loss_type: PreferenceLossType = "sigmoid"
    beta: float = 0.1
    """Inverse temperature of the implicit reward (IPO: the regulariser tau; SimPO: the reward scale)."""
    label_smoothing: float = 0.0
    """The assumed fraction of flipped labels, in [0, 0.5): cDPO (sigmoid), robust DPO, SimPO."""
    simpo_gamma: float = 0.5
    """SimPO's target reward margin gamma."""
    rpo_alpha: float | None = None
    """Weight of the chosen responses' per-token NLL (RPO); None leaves it out."""

    def __post_init__(self) -> None:
        if self.loss_type not in get_args(PreferenceLossType):
            raise ValueError(f"loss_type must be one of {', '.join(get_args(PreferenceLossType))}, "
                             f"got {self.loss_type!r}")
        if self.beta <= 0:
            raise ValueError(f"beta must be positive, got {self.beta}")
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ValueError(f"label_smoothing must lie in [0, 0.5), got {self.label_smoothing}")
        if self.label_smoothing and self.loss_type in ("ipo", "hinge"):
            raise ValueError(f"label_smoothing has no meaning for loss_type {self.loss_type!r} (it applies to sigmoid, "
                             "robust and simpo): set it to 0")

    @property
    def needs_reference(self) -> bool:
        return self.loss_type not in REFERENCE_FREE
