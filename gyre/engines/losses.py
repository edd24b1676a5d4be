"""Step losses that combine the pure algorithm functions for the trainer backend.

Each loss is called once per micro-batch with the current log-probs and returns that micro-batch's
share of the optimizer-step loss, scaled by the global denominator, and adds token-weighted metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from gyre.algos import LossDenominator, aggregate_loss, kl_estimate, masked_sum, ppo_clip_loss
from gyre.tracking.sums import MetricSums
from gyre.types import TrainBatch


@dataclass(frozen=True)
class GRPOLossSpec:
    """The knobs of the GRPO loss; the driver sends these to every trainer rank."""

    temperature: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    old_source: Literal["recomputed", "rollout", "current"] = "recomputed"
    """"recomputed" (batch.old_logprobs), "rollout" (sampler log-probs) or "current" (detached)."""


@dataclass
class GRPOLoss:
    """PPO-clip on group-normalised advantages + optional k3 KL-to-reference and entropy terms."""

    denom: LossDenominator
    spec: GRPOLossSpec = GRPOLossSpec()

    @property
    def temperature(self) -> float:
        return self.spec.temperature

    @property
    def entropy_grad(self) -> bool:
        return self.spec.entropy_coef > 0

    def __call__(self, batch: TrainBatch, logprobs: torch.Tensor, entropy: torch.Tensor | None,
                 metrics: MetricSums) -> torch.Tensor:
        dev = logprobs.device
        mask = batch.response_mask.to(dev)
        adv = batch.advantages.to(dev)
        spec = self.spec
        old = self._old_logprobs(batch, logprobs).to(dev)
        out = ppo_clip_loss(logprobs, old, adv, spec.clip_low, spec.clip_high)
        loss = aggregate_loss(out.token_loss, mask, "token-mean", self.denom)
        tokens = float(mask.sum())
        if spec.kl_coef > 0:
            kl = kl_estimate(logprobs, batch.ref_logprobs.to(dev), "k3")
            loss = loss + spec.kl_coef * aggregate_loss(kl, mask, "token-mean", self.denom)
            metrics.add("kl_ref", float(masked_sum(kl.detach(), mask)), tokens)
        if entropy is not None:
            if spec.entropy_coef > 0:
                loss = loss - spec.entropy_coef * aggregate_loss(entropy, mask, "token-mean", self.denom)
            metrics.add("entropy", float(masked_sum(entropy.detach(), mask)), tokens)
        with torch.no_grad():
            metrics.add("pg_loss", float(masked_sum(out.token_loss.detach(), mask)), tokens)
            metrics.add("clip_frac_low", float(masked_sum(out.clipped_low, mask)), tokens)
            metrics.add("clip_frac_high", float(masked_sum(out.clipped_high, mask)), tokens)
            metrics.add("clip_frac", float(masked_sum(out.clipped_low + out.clipped_high, mask)), tokens)
            metrics.add("approx_kl", float(masked_sum(kl_estimate(old, logprobs.detach(), "k3"), mask)), tokens)
            metrics.add("ratio_mean", float(masked_sum(out.ratio, mask)), tokens)
            # pi_old against the sampler's log-probs: the train-inference mismatch at the weights that
            # generated the batch (0 when the sampler's log-probs serve as pi_old).
            metrics.add("logprob_mismatch", float(masked_sum((old - batch.rollout_logprobs.to(dev)).abs(), mask)),
                        tokens)
        return loss

    def _old_logprobs(self, batch: TrainBatch, logprobs: torch.Tensor) -> torch.Tensor:
        if self.spec.old_source == "recomputed":
            if batch.old_logprobs is None:
                raise ValueError("old log-probs were to be recomputed but the batch has none")
            return batch.old_logprobs
        if self.spec.old_source == "rollout":
            return batch.rollout_logprobs
        return logprobs.detach()


@dataclass
class SFTLoss:
    """Token-mean negative log-likelihood of the response tokens (global denominator)."""

    denom: LossDenominator
    temperature: float = 1.0
    entropy_grad: bool = False

    def __call__(self, batch: TrainBatch, logprobs: torch.Tensor, entropy: torch.Tensor | None,
                 metrics: MetricSums) -> torch.Tensor:
        mask = batch.response_mask.to(logprobs.device)
        nll = -logprobs
        tokens = float(mask.sum())
        metrics.add("sft_loss", float(masked_sum(nll.detach(), mask)), tokens)
        return aggregate_loss(nll, mask, "token-mean", self.denom)
