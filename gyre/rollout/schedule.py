"""The rollout scheduler's rules from a config: shared by training (``gyre.pipelines.rlvr``) and the
simulator (``gyre.sim.scenario``), so both run the scheduler with the same rules. Light: no torch."""

from __future__ import annotations

import math

from gyre.config.schema import RLVRConfig
from gyre.rollout.policies import GroupFilter, TailSpec
from gyre.rollout.scheduler import ScheduleSpec
from gyre.types import SamplingParams


def sampling_params(cfg: RLVRConfig) -> SamplingParams:
    """Training samples' sampling parameters, from ``rollout.sampling``."""
    s = cfg.rollout.sampling
    return SamplingParams(s.temperature, s.top_p, s.top_k, s.max_new_tokens, tuple(s.stop))


def schedule_spec(cfg: RLVRConfig, sampling: SamplingParams) -> ScheduleSpec:
    """The rollout scheduler's rules, from the ``rollout`` section."""
    r = cfg.rollout
    ds, tail = r.dynamic_sampling, r.tail_batching
    lockstep = r.async_ratio > 0 and r.async_mode == "lockstep"  # async_mode means nothing without asynchrony
    return ScheduleSpec(
        r.samples_per_prompt, r.prompts_per_step, sampling, cfg.run.seed, async_ratio=r.async_ratio,
        replicate=r.replicate, redundancy=r.redundancy,
        group_filter=GroupFilter(ds.min_std, ds.mean_range) if ds else None,
        max_draws=math.ceil(ds.max_draws * r.prompts_per_step) if ds else None,
        tail=TailSpec(tail.eta_prompts, tail.eta_samples) if tail else None,
        extra_samples=cfg.env.extra_samples if cfg.env is not None else 0,
        restart_stale=cfg.env is not None and cfg.env.stale_episodes == "restart",
        greedy=cfg.algorithm.advantage.row.greedy,
        lockstep=lockstep,
        drop_expired=r.expired == "drop",
        # Window asynchrony dispatches as capacity frees: an engine is given at most the rows it decodes at
        # once. Synchronous and lockstep runs keep every request on its engine from admission: which samples
        # share a decoding step must not depend on timing, so a seed reproduces the run.
        engine_slots=r.max_batch_size if r.async_ratio > 0 and not lockstep else None)
