"""Supervised fine-tuning on (prompt, response) pairs with the policy trainer ranks.

Used as the warm-up before RL (``sft_warmup`` in a run config): it teaches the answer format so that
RL starts from a policy whose samples sometimes earn reward.
"""

from __future__ import annotations

import time

from gyre.algos import LossDenominator
from gyre.config.derive import RunPlan
from gyre.config.schema import SFTConfig
from gyre.data.batching import collate, split_for_ranks
from gyre.data.prompts import load_sft_examples
from gyre.data.sampler import EpochSampler
from gyre.pipelines.roles import Roles
from gyre.seeding import derive_seed
from gyre.types import TrainStepResult


def run_sft(sft: SFTConfig, plan: RunPlan, roles: Roles, renderer, pad_id: int, eos_id: int, seed: int,
            logger, progress) -> dict:
    """``sft.steps`` optimizer steps; logs each step under phase "sft"; returns the last metrics."""
    examples = load_sft_examples(sft.train_files, renderer, eos_id, sft.max_tokens)
    sampler = EpochSampler(len(examples), seed=derive_seed(seed, "sft"))
    roles.timeshare.activate("policy")
    roles.policy.call("configure_optimizer", sft.optimizer, sft.scheduler, sft.steps, sft.grad_clip)
    metrics: dict = {}
    for step in range(1, sft.steps + 1):
        start = time.perf_counter()
        chosen = [examples[i] for i in sampler.take(sft.batch_size)]
        batch = collate([e.prompt_ids for e in chosen], [e.response_ids for e in chosen], pad_id)
        denom = LossDenominator(tokens=float(batch.response_mask.sum()), dp_size=plan.dp_size)
        shards, _ = split_for_ranks(batch, plan.dp_size)
        outs = roles.policy.call_each("train_sft", [(s, denom, sft.micro_batch_size) for s in shards])
        metrics = {**TrainStepResult.summarize(outs), "time/step": time.perf_counter() - start}
        logger.log(step, metrics, phase="sft")
        progress.update(step, metrics)
    return metrics
