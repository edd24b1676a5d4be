"""Preference optimisation on the policy trainer ranks: the reference log-probs, then the DPO loop.

The reference log-probs of every pair are computed once, before the first step (TRL's
``precompute_ref_log_probs``): the reference model never changes, so scoring each pair again at every
step would only repeat the same forward passes. Each step then draws ``batch_size`` pairs (seeded
epochs), gives each rank an equal contiguous share of whole pairs, and takes one optimizer step of the
mean per-pair loss over all of them (the global denominator is the step's pair count: the result does not
depend on the ranks or micro-batches; ``gyre.engines.losses.DPOLoss``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gyre.algos.aggregation import LossDenominator
from gyre.cluster.group import RoleGroup
from gyre.cluster.workers import PolicyWorker
from gyre.data.preference import PreferencePair, preference_batch, sequence_sums
from gyre.pipelines.sft import SFTTrainer, optimizer_steps
from gyre.types import TrainStepResult

REFERENCE_CHUNK_PAIRS = 64
"""Pairs one rank scores per call while computing the reference log-probs."""


def reference_logprobs(pairs: Sequence[PreferencePair], group: RoleGroup, method, pad_id: int,
                       chunk_pairs: int = REFERENCE_CHUNK_PAIRS) -> None:
    """Set each pair's ``ref_chosen`` and ``ref_rejected``: its two completions' log-probs under the model
    ``group``'s ranks hold, summed over the completion tokens.

    Args:
        method: ``ReferenceWorker.compute_logprobs``, or ``PolicyWorker.compute_ref_logprobs`` (the policy's
            base model with its LoRA adapters off).
        chunk_pairs: pairs per rank per call. Every rank gets an equal share of each call (a short last
            call is filled with copies of its last pair, whose results are dropped), since FSDP2 ranks run
            their forward passes together.
    """
    ranks = len(group)
    for start in range(0, len(pairs), chunk_pairs * ranks):
        part = list(pairs[start:start + chunk_pairs * ranks])
        shares = preference_batch(part + [part[-1]] * (-len(part) % ranks), pad_id, with_reference=False).split(ranks)
        outs = group.call_each(method, [(share.rows, 1.0) for share in shares])
        sums = torch.cat([sequence_sums(lp, share.rows)[0] for lp, share in zip(outs, shares)])
        for i, pair in enumerate(part):
            pair.ref_chosen, pair.ref_rejected = float(sums[2 * i]), float(sums[2 * i + 1])


def run_dpo(dpo, pairs: Sequence[PreferencePair], trainer: SFTTrainer, pad_id: int, seed: int, logger,
            progress) -> dict:
    """``dpo.steps`` optimizer steps (``dpo``: the DPOConfig section); logs each step under phase "dpo";
    returns the last metrics."""
    spec = dpo.loss_spec()

    def step(indices: list[int]) -> tuple[list[TrainStepResult], dict]:
        batch = preference_batch([pairs[i] for i in indices], pad_id, with_reference=spec.needs_reference)
        tokens = float(batch.rows.response_mask.sum())
        denom = LossDenominator(tokens=tokens, sequences=float(len(batch)), dp_size=trainer.dp_size)
        shares = batch.split(trainer.dp_size)
        outs = trainer.policy.call_each(PolicyWorker.train_dpo,
                                        [(s, denom, dpo.micro_batch_size, spec) for s in shares])
        return outs, {"dpo/pairs": float(len(batch)), "dpo/trained_tokens": tokens}

    return optimizer_steps(dpo, len(pairs), seed, trainer, "dpo", step, logger, progress)
