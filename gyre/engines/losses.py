"""Step losses that combine the pure algorithm functions for the trainer backend.

Each loss runs the forward pass it needs (``compute``, on the trainer's ``ForwardContext``: device,
autocast dtype, memory levers), is called once per micro-batch, and returns
that micro-batch's share of the optimizer-step loss, scaled by the global denominator; it adds
token-weighted metrics on the way. ``__call__`` takes the forward's outputs, so tests can drive the
maths with hand-made log-probs.

Every per-token input is selected on the loss mask (``where_valid``) before any arithmetic: padding may
hold NaN or inf (a -inf reference log-prob, a NaN from the sampler), and a product with 0 would carry it
into the loss or, as 0 * NaN, into the gradient.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from gyre.algos.aggregation import AggMode, LossDenominator, aggregate_loss
from gyre.algos.distill import distill_loss_tokens, reverse_kl_tokens
from gyre.algos.kl import kl_estimate, kl_straight_through
from gyre.algos.loss_table import POLICY_LOSSES, OldSource, PolicyLossSpec, PolicyLossVariant
from gyre.algos.policy_loss import PolicyLossInputs, PolicyLossOutput
from gyre.algos.preference import PairLogps, PreferenceLossSpec, preference_loss
from gyre.algos.stats import masked_sum, where_valid
from gyre.algos.value import value_loss
from gyre.engines.forward import ForwardContext, sequence_logprobs, sequence_values
from gyre.types import MetricSums, TrainBatch

if TYPE_CHECKING:
    from gyre.types import PreferenceBatch

__all__ = ["DPOLoss", "OldSource", "PolicyLoss", "PolicyLossSpec", "SFTLoss", "ValueLoss"]


@dataclass
class PolicyLoss:
    """Policy-gradient term (the configured variant) + optional KL-to-reference and entropy terms."""

    denom: LossDenominator
    spec: PolicyLossSpec = PolicyLossSpec()
    variant: PolicyLossVariant = field(init=False, repr=False)
    """The spec's row of ``POLICY_LOSSES``, looked up once, here."""

    def __post_init__(self) -> None:
        self.variant = POLICY_LOSSES.get(self.spec.variant)

    def compute(self, model, micro: TrainBatch, fwd: ForwardContext, metrics: MetricSums) -> torch.Tensor:
        lp, ent = sequence_logprobs(model, micro, fwd, self.spec.temperature, entropy=True,
                                    entropy_grad=self.spec.entropy_coef > 0)
        return self(micro, lp, ent, metrics)

    def __call__(self, batch: TrainBatch, logprobs: torch.Tensor, entropy: torch.Tensor | None,
                 metrics: MetricSums) -> torch.Tensor:
        dev = logprobs.device
        spec = self.spec
        mask = batch.response_mask.to(dev)
        old = self._old_logprobs(batch, logprobs).to(dev)
        out = self._policy_terms(batch, logprobs, old, mask)
        token_loss = out.token_loss
        if batch.token_weights is not None:
            token_loss = token_loss * where_valid(batch.token_weights.to(dev), mask, 1.0)
        loss = aggregate_loss(token_loss, mask, spec.agg, self.denom)
        tokens = mask.sum()
        kl_spec = spec.kl
        if kl_spec.loss_coef > 0:
            kl = kl_straight_through(where_valid(logprobs, mask), where_valid(batch.ref_logprobs.to(dev), mask),
                                     kl_spec.loss_estimator, kl_spec.loss_grad_estimator, kl_spec.clamp)
            loss = loss + kl_spec.loss_coef * aggregate_loss(kl, mask, spec.agg, self.denom)
            metrics.add("kl_ref", masked_sum(kl.detach(), mask), tokens)
        if spec.distill_loss_coef > 0:
            loss = loss + spec.distill_loss_coef * self._distill_term(batch, logprobs, mask, metrics)
        if entropy is not None:
            entropy = where_valid(entropy, mask)
            if spec.entropy_coef > 0:
                # AsyPPO's I^H takes tokens out of the bonus but not out of its denominator.
                kept = entropy if batch.entropy_mask is None else entropy * batch.entropy_mask.to(dev)
                loss = loss - spec.entropy_coef * aggregate_loss(kept, mask, spec.agg, self.denom)
            metrics.add("entropy", masked_sum(entropy.detach(), mask), tokens)
        self._metrics(batch, out, old, logprobs.detach(), mask, metrics)
        return loss

    def _distill_term(self, batch: TrainBatch, logprobs: torch.Tensor, mask: torch.Tensor,
                      metrics: MetricSums) -> torch.Tensor:
        """On-policy distillation's loss term (``gyre.algos.distill``), aggregated like the policy loss."""
        if batch.teacher_logprobs is None:
            raise ValueError("algorithm.distill.mode=loss needs the teacher's log-probs; the batch has none")
        teacher = batch.teacher_logprobs.to(logprobs.device)
        token_loss = distill_loss_tokens(logprobs, teacher, mask)
        tokens = mask.sum()
        metrics.add("distill/loss", token_loss.detach().sum(), tokens)
        metrics.add("distill/reverse_kl_current", reverse_kl_tokens(logprobs, teacher, mask).sum(), tokens)
        return aggregate_loss(token_loss, mask, self.spec.agg, self.denom)

    def _policy_terms(self, batch: TrainBatch, lp: torch.Tensor, old: torch.Tensor,
                      mask: torch.Tensor) -> PolicyLossOutput:
        dev = lp.device
        scores = batch.scores.to(dev) if batch.scores is not None else None
        inputs = PolicyLossInputs(lp, old, batch.advantages.to(dev), mask, batch.rollout_logprobs.to(dev), scores)
        return self.variant.loss(inputs.on_mask(), self.spec, self.spec.knobs)

    @torch.no_grad()
    def _metrics(self, batch: TrainBatch, out: PolicyLossOutput, old: torch.Tensor, lp: torch.Tensor,
                 mask: torch.Tensor, metrics: MetricSums) -> None:
        tokens = mask.sum()

        def add(name: str, values: torch.Tensor) -> None:
            metrics.add(name, masked_sum(values, mask), tokens)

        add("pg_loss", out.token_loss.detach())
        add("clip_frac_low", out.clipped_low)
        add("clip_frac_high", out.clipped_high)
        add("clip_frac", out.clipped_low + out.clipped_high)
        if out.dropped is not None:
            add("dropped_frac", out.dropped)
        if out.penalised is not None:
            add("penalised_frac", out.penalised)
        add("approx_kl", kl_estimate(old, lp, "k3"))
        add("ratio_mean", out.ratio)
        add("ratio_abs_dev", (out.ratio - 1.0).abs())
        # pi_old against the sampler's log-probs: the train-inference mismatch at the weights that
        # generated the batch (0 when the sampler's log-probs serve as pi_old).
        add("logprob_mismatch", (old - batch.rollout_logprobs.to(lp.device)).abs())

    def _old_logprobs(self, batch: TrainBatch, logprobs: torch.Tensor) -> torch.Tensor:
        if self.spec.old_source == "recomputed":
            if batch.old_logprobs is None:
                raise ValueError("old log-probs were to be recomputed but the batch has none")
            return batch.old_logprobs
        if self.spec.old_source == "rollout":
            return batch.rollout_logprobs
        return logprobs.detach()


@dataclass
class ValueLoss:
    """The critic's regression on the GAE returns, optionally clipped around the old values (PPO)."""

    denom: LossDenominator
    clip: float | None = None
    loss_agg: AggMode = "token-mean"

    def compute(self, model, micro: TrainBatch, fwd: ForwardContext, metrics: MetricSums) -> torch.Tensor:
        return self(micro, sequence_values(model, micro, fwd), metrics)

    def __call__(self, batch: TrainBatch, values: torch.Tensor, metrics: MetricSums) -> torch.Tensor:
        dev = values.device
        if batch.values is None or batch.returns is None:
            raise ValueError("the critic trains on batch.values and batch.returns; the batch has none")
        mask = batch.response_mask.to(dev)
        token_loss, clipped = value_loss(where_valid(values, mask), where_valid(batch.values.to(dev), mask),
                                         where_valid(batch.returns.to(dev), mask), self.clip)
        tokens = mask.sum()
        metrics.add("critic/value_loss", masked_sum(token_loss.detach(), mask), tokens)
        metrics.add("critic/value_clip_frac", masked_sum(clipped, mask), tokens)
        metrics.add("critic/values", masked_sum(values.detach(), mask), tokens)
        return aggregate_loss(token_loss, mask, self.loss_agg, self.denom)


@dataclass
class SFTLoss:
    """Token-mean negative log-likelihood of the response tokens (global denominator)."""

    denom: LossDenominator
    temperature: float = 1.0

    def compute(self, model, micro: TrainBatch, fwd: ForwardContext, metrics: MetricSums) -> torch.Tensor:
        lp, _ = sequence_logprobs(model, micro, fwd, self.temperature)
        return self(micro, lp, None, metrics)

    def __call__(self, batch: TrainBatch, logprobs: torch.Tensor, entropy: torch.Tensor | None,
                 metrics: MetricSums) -> torch.Tensor:
        mask = batch.response_mask.to(logprobs.device)
        nll = -where_valid(logprobs, mask)
        tokens = mask.sum()
        metrics.add("sft_loss", masked_sum(nll.detach(), mask), tokens)
        return aggregate_loss(nll, mask, "token-mean", self.denom)


@dataclass
class DPOLoss:
    """The mean per-pair preference loss (``gyre.algos.preference``) over every pair of the optimizer step:
    a micro-batch of whole pairs contributes its pairs' summed loss over the step's pair count (the
    global denominator, ``denom.sequences``), so any split into ranks and micro-batches gives the same
    step. Metrics carry TRL's names (rewards/chosen, rewards/accuracies, ...), averaged over pairs."""

    denom: LossDenominator
    """``sequences``: the pairs of the whole optimizer step, over all ranks."""
    spec: PreferenceLossSpec = PreferenceLossSpec()

    def compute(self, model, micro: PreferenceBatch, fwd: ForwardContext, metrics: MetricSums) -> torch.Tensor:
        lp, _ = sequence_logprobs(model, micro.rows, fwd, 1.0)
        return self(micro, lp, metrics)

    def __call__(self, batch: PreferenceBatch, logprobs: torch.Tensor, metrics: MetricSums) -> torch.Tensor:
        """``logprobs`` [2P, L]: per-token log-probs of ``batch.rows`` (chosen rows even, rejected odd)."""
        mask = batch.rows.response_mask.to(logprobs.device)
        sums, lengths = where_valid(logprobs, mask).sum(dim=1), mask.sum(dim=1)
        policy = PairLogps(sums[0::2], sums[1::2], lengths[0::2], lengths[1::2])
        reference = None
        if batch.ref_chosen is not None:
            reference = PairLogps(batch.ref_chosen.to(logprobs.device), batch.ref_rejected.to(logprobs.device),
                                  lengths[0::2], lengths[1::2])
        out = preference_loss(policy, reference, self.spec)
        pairs = float(len(batch))
        for name, values in (("dpo_loss", out.losses.detach()), ("rewards/chosen", out.chosen_rewards),
                             ("rewards/rejected", out.rejected_rewards), ("rewards/accuracies", out.accuracies),
                             ("rewards/margins", out.margins), ("logps/chosen", policy.chosen.detach()),
                             ("logps/rejected", policy.rejected.detach()), ("nll_loss", out.nll)):
            if values is not None:
                metrics.add(name, values.sum(), pairs)
        return out.losses.sum() * (self.denom.dp_size / max(self.denom.sequences, 1.0))
