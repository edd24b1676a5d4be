"""Supervised fine-tuning with the policy trainer ranks: the loop shared by the warm-up and ``gyre sft``.

As the warm-up before RL (``sft_warmup`` in a run config) it teaches the answer format, so that RL starts
from a policy whose samples sometimes earn reward; as a standalone run (``gyre.app.sft_run``) it is
ordinary SFT. Each step draws ``batch_size`` examples (seeded epochs), pads or packs them into rows
(``gyre.data.sft.sft_batch``), and takes one optimizer step of the token-mean loss over the trained
tokens of the whole batch (a global denominator: the result does not depend on the ranks or rows).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gyre.algos.aggregation import LossDenominator
from gyre.cluster.group import RoleGroup
from gyre.cluster.workers import PolicyWorker
from gyre.config.schema import SFTConfig
from gyre.data.batching import split_for_ranks
from gyre.data.sampler import EpochSampler
from gyre.data.sft import SFTExample, sft_batch
from gyre.seeding import derive_seed
from gyre.types import TrainStepResult


@dataclass
class SFTTrainer:
    """The policy trainer ranks SFT runs on."""

    policy: RoleGroup
    dp_size: int
    activate: Callable[[], None] = lambda: None
    """Gives the policy its devices first (a run whose roles time-share devices)."""


def run_sft(sft: SFTConfig, examples: Sequence[SFTExample], trainer: SFTTrainer, pad_id: int, seed: int,
            logger, progress) -> dict:
    """``sft.total_steps`` optimizer steps (``sft.steps``, or ``sft.epochs`` passes over ``examples``); logs
    each step under phase "sft"; returns the last metrics."""
    pack = sft.max_tokens if sft.packing else None

    def step(indices: list[int]) -> tuple[list[TrainStepResult], dict]:
        batch = sft_batch([examples[i] for i in indices], pad_id, pack, trainer.dp_size)
        tokens = float(batch.response_mask.sum())
        denom = LossDenominator(tokens=tokens, dp_size=trainer.dp_size)
        shards, _ = split_for_ranks(batch, trainer.dp_size)
        outs = trainer.policy.call_each(PolicyWorker.train_sft, [(s, denom, sft.micro_batch_size) for s in shards])
        return outs, {"sft/trained_tokens": tokens, "sft/rows": len(batch)}

    return optimizer_steps(sft, len(examples), seed, trainer, "sft", step, logger, progress)


def optimizer_steps(section, items: int, seed: int, trainer: SFTTrainer, phase: str,
                    step: Callable[[list[int]], tuple[list[TrainStepResult], dict]], logger, progress) -> dict:
    """The loop of a standalone trainer run (SFT, DPO): a fresh optimizer and schedule from ``section``
    (its optimizer, scheduler and grad_clip) over ``section.total_steps(items)`` steps, each a call of
    ``step`` on the indices of ``section.batch_size`` of the ``items`` (seeded epochs), which returns every
    rank's result and the step's own metrics. Each step is logged under ``phase``; returns the last
    step's metrics."""
    steps = section.total_steps(items)
    sampler = EpochSampler(items, seed=derive_seed(seed, phase))
    trainer.activate()
    trainer.policy.call(PolicyWorker.configure_optimizer, section.optimizer.spec(), section.scheduler.spec(), steps,
                        section.grad_clip)
    metrics: dict = {}
    for n in range(1, steps + 1):
        start = time.perf_counter()
        outs, own = step(sampler.take(section.batch_size))
        metrics = {**TrainStepResult.summarize(outs), **own, "time/step": time.perf_counter() - start}
        logger.log(n, metrics, phase=phase)
        progress.update(n, metrics)
    return metrics
