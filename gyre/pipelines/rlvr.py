"""RLVR: the single-controller training loop (GRPO and every other configured algorithm).

Each step: the rollout machine hands over a batch of scored groups -> collate -> the learner scores it
(old / reference log-probs, critic values) -> advantages and masks -> the learner's optimizer steps
(critic, policy) -> the new weights are published to the rollout engines. ``train_step`` reads top to
bottom.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from gyre.cluster.env_pool import EnvPool
from gyre.cluster.reward_pool import RewardPool
from gyre.cluster.roles import Roles, reward_scorers
from gyre.config.derive import RunPlan
from gyre.config.schema import RLVRConfig
from gyre.data.batching import collate_groups
from gyre.envs.episode import EpisodeLimits
from gyre.rewards.checks import check_reward_failures
from gyre.rollout.driver import CallWait, RolloutDriver
from gyre.rollout.elastic import lent_engines, start_controller
from gyre.rollout.episodes import EpisodeRunner
from gyre.rollout.ledger import step_line
from gyre.rollout.machine import RolloutMachine
from gyre.rollout.schedule import sampling_params, schedule_spec
from gyre.tracking.generations import GenerationWriter
from gyre.tracking.progress import Progress
from gyre.tracking.report import refresh_report
from gyre.tracking.tables import write_validation_table
from gyre.tracking.timeline import Timeline
from gyre.training.advantage import AlgorithmState, correct_mismatch, estimate_advantages
from gyre.training.checkpoint import CheckpointManager, DriverState, ResumeError
from gyre.training.learner import Learner
from gyre.training.run_data import RunData, config_fingerprint
from gyre.types import Group, SamplingParams, TrainBatch, Trajectory

REPORT_INTERVAL_S = 60.0
"""report.html is refreshed at a validation only if the last refresh is at least this old."""


@dataclass
class RunSummary:
    steps: int
    first_val_accuracy: float | None
    last_val_accuracy: float | None
    final_model: Path | None
    seconds: float


class RLVRPipeline:
    def __init__(self, cfg: RLVRConfig, plan: RunPlan, roles: Roles, data: RunData, logger,
                 checkpoints: CheckpointManager, timeline: Timeline | None = None):
        self.cfg, self.plan, self.roles, self.data = cfg, plan, roles, data
        self.logger, self.checkpoints = logger, checkpoints
        self.timeline = timeline or Timeline(None)
        """Where the workers' phase spans go (``timeline.jsonl``); by default nowhere."""
        self.sampling = sampling_params(cfg)
        self.rewards = RewardPool(reward_scorers(cfg, roles.reward))
        envs = EnvPool(roles.envs, cfg.env.slots_per_worker, max(cfg.env.reset_timeout_s, cfg.env.step_timeout_s)) \
            if cfg.env is not None else None
        elastic = lent_engines(cfg, len(roles.rollout), roles.lend_rollout) if roles.lend_rollout else None
        self.capacity = elastic.capacity if elastic is not None else None
        """How many rollout engines the run should have (rollout.elastic), else None: a fixed pool."""
        driver = RolloutDriver(roles.rollout, self.rewards, cfg.rollout.emit_every, replaceable=not roles.hybrid,
                               envs=envs, elastic=elastic)
        self.rollout = RolloutMachine(driver, schedule_spec(cfg, self.sampling), data.next_train_prompts,
                                      lambda fresh=False: roles.activate_rollout(fresh, cfg.policy.lora is not None),
                                      cfg.rollout.partial,
                                      sources=episode_runners(cfg, data, envs))
        # With asynchrony the rollout goes on while the learner's calls run.
        overlap = lambda group, method, refs: self.rollout.wait_for(CallWait(tuple(refs), group, method))  # noqa: E731
        self.learner = Learner(cfg, plan, roles, overlap if cfg.rollout.async_ratio > 0 else None)
        self.reward_totals = {"errors": 0, "timeouts": 0}
        self.val_history: list[float | None] = []
        self.algo_state = AlgorithmState.create(cfg.algorithm)
        self.recoveries = 0
        """In-run recoveries so far (set by the launcher, which rebuilds the pipeline after a fault)."""
        self._report_written = -math.inf
        """When report.html was last refreshed (time.monotonic); the run's end always writes it."""
        self.generations = generation_writer(cfg, data, logger)

    # ---- the loop ---------------------------------------------------------------------------
    def run(self, resume_from: Path | None = None, echo=print) -> RunSummary:
        t0 = time.perf_counter()
        if self.capacity is not None and self.cfg.rollout.elastic.controller:
            start_controller(self.cfg.rollout.elastic.controller, self.capacity)
        start = self.restore(resume_from, echo) if resume_from else self.begin()
        self.timeline.collect(self.roles.groups(), start)
        name = (self.cfg.algorithm.preset or "RL").upper()
        progress = Progress(self.cfg.run.steps, start=start, enabled=self.cfg.logging.progress, description=name)
        self.roles.watchdog.on_slow = progress.heartbeat  # a call far slower than usual shows what the run waits on
        try:
            for step in range(start + 1, self.cfg.run.steps + 1):
                metrics = self.train_step(step)
                validated = self._due(self.cfg.validation.every, step)
                if validated:
                    t_val = time.perf_counter()
                    with self.timeline.driver("validate", step):
                        metrics.update(self.validate(step))
                    metrics["time/validate"] = time.perf_counter() - t_val
                self.logger.log(step, metrics)
                progress.update(step, {**metrics, "val/accuracy": self.val_history[-1] if self.val_history else None})
                self.after_step(step, validated)
        except BaseException:
            elastic = getattr(self.rollout.driver, "elastic", None)
            if elastic is not None:  # lent engines still starting are outside the role groups a recovery kills
                elastic.close()
            raise
        finally:
            progress.close()
        if not self._due(self.cfg.checkpoint.every, self.cfg.run.steps):  # a final checkpoint closed the books
            self.logger.ledger(self.rollout.ledger_close(self.cfg.run.steps))
        self.rollout.close()
        with self.timeline.driver("checkpoint", self.cfg.run.steps):
            final = self.save_final_model()
        self.timeline.collect(self.roles.groups(), self.cfg.run.steps)
        return RunSummary(self.cfg.run.steps, self.val_history[0] if self.val_history else None,
                          self.val_history[-1] if self.val_history else None, final, time.perf_counter() - t0)

    def after_step(self, step: int, validated: bool) -> None:
        """What a step leaves on disk: the validation table, a checkpoint when due, the workers' phase spans,
        and report.html after a validation (at most once a minute: it takes about a second to write)."""
        if validated:
            self.write_validation_table()
        if self._due(self.cfg.checkpoint.every, step):
            self.save_checkpoint(step)
        self.timeline.collect(self.roles.groups(), step)
        now = time.monotonic()
        if validated and self.cfg.logging.report and now - self._report_written >= REPORT_INTERVAL_S:
            self._report_written = now
            with self.timeline.driver("report", step):
                refresh_report(self.cfg.run.output_dir)

    def begin(self) -> int:
        """A fresh run: rollout engines get the (warmed-up) policy as version 0; validate once. With
        in-run recovery on, a checkpoint of step 0 gives a fault before the first save a place to return to."""
        self.publish(0)
        if self.cfg.validation.every:
            with self.timeline.driver("validate", 0):
                self.logger.log(0, self.validate(0))
        if self.cfg.run.max_restarts:
            self.save_checkpoint(0)
        return 0

    def _due(self, every: int, step: int) -> bool:
        return bool(every) and (step % every == 0 or step == self.cfg.run.steps)

    def train_step(self, step: int) -> dict:
        timer: dict[str, float] = {}
        t_start = time.perf_counter()
        if self.capacity is not None and self.capacity.at_step(step) and self.cfg.rollout.elastic.wait_for_joins:
            self.rollout.driver.await_joins()  # the schedule's pool size for this step, there before it starts
        rollout = self.rollout.next_batch(step)  # rewards start on each sample as soon as it is generated
        self.logger.ledger(step_line(step, rollout.ledger))
        timer.update(generate=rollout.times.generate, reward=rollout.times.reward)
        trajectories = rollout.trajectories
        reward_stats = self.reward_metrics(trajectories)
        batch, _ = collate_groups(rollout.groups, self.data.pad_id, self.plan.rows_multiple)
        with _phase(timer, "logprobs"):
            self.learner.score(batch)
        algo_metrics = self.compute_advantages(rollout.groups, batch)
        self.generations.train(step, rollout.groups, batch)
        with _phase(timer, "train"):
            train_metrics = self.learner.update(batch, step)
        with _phase(timer, "weight_sync"):
            self.publish(step)
        timer["step"] = time.perf_counter() - t_start
        idle = self.idle_fractions(timer, self.rollout.busy_seconds())
        # Samples carry the version that generated them; the policy trained them at version step - 1.
        sample_version = min(t.weight_version for t in trajectories)
        versions = {"sample_weight_version": sample_version, "staleness/max": step - 1 - sample_version,
                    "weight_version": self.rollout.version, "batch/rows": len(batch),
                    # Rows count padding and, for step-level samples, one row per turn: throughput counts these.
                    "batch/samples": len(trajectories),
                    "batch/response_tokens": sum(len(s.token_ids) for t in trajectories for s in t.segments
                                                 if s.trainable)}
        faults = {**self.rewards.metrics(), "fault/recoveries": self.recoveries,
                  "fault/rollout_engine_deaths": self.rollout.driver.engine_deaths,
                  "fault/rollout_engine_hangs": self.rollout.driver.engine_hangs}
        if self.rollout.driver.envs is not None:
            faults["fault/env_worker_restarts"] = self.rollout.driver.envs.worker_restarts
        if self.learner.channel is not None:
            faults["fault/weight_channel_fallbacks"] = self.rollout.driver.channel_fallbacks
        if self.rollout.driver.elastic is not None:
            faults.update(self.rollout.driver.elastic.metrics())
        return {**sample_metrics(trajectories), **domain_metrics(trajectories, self.cfg.reward), **reward_stats,
                **algo_metrics, **train_metrics, **versions, **rollout.stats, **idle, **faults,
                **{f"time/{k}": v for k, v in timer.items()}}

    # ---- steps ------------------------------------------------------------------------------
    def reward_metrics(self, trajectories: list[Trajectory]) -> dict:
        """Failed rewards score 0 and are counted (too many in one step stop the run)."""
        check_reward_failures(trajectories, self.cfg.reward)
        errors = sum(t.reward.status == "error" for t in trajectories)
        timeouts = sum(t.reward.status == "timeout" for t in trajectories)
        self.reward_totals["errors"] += errors
        self.reward_totals["timeouts"] += timeouts
        latency = [t.reward.latency_s for t in trajectories]
        return {"reward/errors": errors, "reward/timeouts": timeouts,
                "reward/errors_total": self.reward_totals["errors"],
                "reward/timeouts_total": self.reward_totals["timeouts"],
                "reward/latency_mean": sum(latency) / len(latency), "reward/latency_max": max(latency)}

    def compute_advantages(self, groups: list[Group], batch: TrainBatch) -> dict:
        """Advantages, returns and loss masks (``gyre.training.advantage``), group statistics over ``groups``."""
        keep, metrics = correct_mismatch(batch, self.cfg.algorithm.mismatch)
        env = self.cfg.env
        budget = env.turn_tokens if env is not None else self.cfg.rollout.sampling.max_new_tokens  # per response
        metrics.update(estimate_advantages(batch, groups, self.cfg.algorithm, self.plan, self.algo_state, budget, keep))
        return metrics

    def idle_fractions(self, timer: dict[str, float], engine_busy: list[float]) -> dict[str, float]:
        """The share of the step each role was idle: rollout engines (not decoding, their mean) and the
        policy (not computing log-probs or training: waiting for the batch or the weight sync)."""
        step = timer["step"]
        busy = sum(engine_busy) / len(engine_busy)
        return {"idle/rollout": max(0.0, 1 - busy / step),
                "idle/policy": max(0.0, 1 - (timer.get("logprobs", 0) + timer.get("train", 0)) / step)}

    def publish(self, version: int) -> None:
        """The engines take the policy's weights as ``version`` (verified on each)."""
        self.rollout.publish(version, self.learner.export(version))

    def validate(self, step: int) -> dict:
        """Held-out accuracy and reward (after ``step``); a sample of the generations is written."""
        groups = self.rollout.evaluate(self.data.val_prompts, validation_params(self.cfg),
                                       self.cfg.validation.samples_per_prompt)
        self.generations.validation(step, groups)
        failed = {"val/groups_failed": len(self.data.val_prompts) - len(groups)} if self.cfg.env is not None else {}
        trajectories = [t for g in groups for t in g.trajectories]
        if not trajectories:  # every validation environment failed too often (counted): nothing to score
            return failed
        self.reward_metrics(trajectories)  # failures are counted (and stop the run) as in training
        metrics = {f"val/{k}": val for k, val in {**sample_metrics(trajectories),
                                                   **domain_metrics(trajectories, self.cfg.reward)}.items()}
        self.val_history.append(metrics.get("val/accuracy"))  # None: the reward does not judge correctness
        return {**metrics, **failed}

    def write_validation_table(self) -> None:
        """validation.md: held-out accuracy at every validation so far, overall and per domain."""
        domains = [] if self.cfg.reward.single else list(self.cfg.reward.domains)
        out = Path(self.cfg.run.output_dir)
        write_validation_table(out / "metrics.jsonl", out / "validation.md", domains)

    # ---- persistence --------------------------------------------------------------------------
    def save_checkpoint(self, step: int) -> None:
        with self.timeline.driver("checkpoint", step):
            self._save_checkpoint(step)

    def _save_checkpoint(self, step: int) -> None:
        tmp = self.checkpoints.begin(step)
        self.learner.save(tmp)
        state = DriverState(step=step, data=self.data.train_sampler.state_dict(), weight_version=self.rollout.version,
                            run_steps=self.cfg.run.steps, config_hash=config_fingerprint(self.cfg),
                            reward_totals=dict(self.reward_totals), val_history=list(self.val_history),
                            algorithm={**self.algo_state.to_dict(), "rewards": self.rewards.state_dict()},
                            rollout=self.rollout.state_dict())
        self.logger.ledger(self.rollout.ledger_close(step))  # after state_dict: a lockstep rollout settles there
        self.checkpoints.commit(tmp, state)

    def restore(self, path: Path, echo=print) -> int:
        """Continue from checkpoint ``path``: trainer state, data position, counters, rollout weights."""
        state = self.checkpoints.load_state(path)
        if state.config_hash != config_fingerprint(self.cfg):
            echo("warning: the config differs from the checkpointed run's (beyond run.steps and logging)")
        if state.run_steps != self.cfg.run.steps:
            echo(f"note: run.steps changed from {state.run_steps} to {self.cfg.run.steps}: the LR schedule now spans "
                 "the new length")
        self.learner.restore(path)
        self.algo_state.load_dict(state.algorithm)
        self.rewards.load_state_dict(state.algorithm.get("rewards", {}))
        try:
            self.data.train_sampler.load_state_dict(state.data)
            self.rollout.load_state_dict(state.rollout, self.data.prompt_index(), state.step)
        except ValueError as exc:
            raise ResumeError(f"cannot resume from {path}: {exc}") from None
        self.reward_totals.update(state.reward_totals)
        self.val_history = list(state.val_history)
        self.publish(state.weight_version)
        return state.step

    def save_final_model(self) -> Path:
        """final_model/ (LoRA: merged) and, with LoRA, final_adapter/ as policy.lora.save asks; returns the
        model directory, or the adapter's when only that is written."""
        out = Path(self.cfg.run.output_dir) / "final_model"
        m = self.cfg.model  # resolved: save_dtype is concrete ("auto" became the input's dtype)
        lora = self.cfg.policy.lora
        if lora is None:
            self.learner.save_model(out, m.tokenizer_path or m.path, m.save_dtype)
            return out
        adapter = out.with_name("final_adapter")
        merged, kept = (out if lora.save != "adapter" else None), (adapter if lora.save != "merged" else None)
        self.learner.save_model(merged, m.tokenizer_path or m.path, m.save_dtype, kept)
        return merged or adapter


def generation_writer(cfg: RLVRConfig, data: RunData, logger) -> GenerationWriter:
    """Sample generations to run.output_dir/generations and the trackers (logging.generations_*)."""
    log = cfg.logging
    return GenerationWriter(Path(cfg.run.output_dir) / "generations", logger, log.generations_every,
                            log.generations_samples, lambda ids: data.tokenizer.decode(ids, skip_special_tokens=True),
                            not cfg.reward.single, cfg.run.steps)


def validation_params(cfg: RLVRConfig) -> SamplingParams:
    """How held-out prompts are sampled (validation, ``gyre eval``): validation.temperature, no truncation,
    the rollout's length limit and stop strings."""
    s, v = cfg.rollout.sampling, cfg.validation
    return SamplingParams(v.temperature, 1.0, 0, s.max_new_tokens, tuple(s.stop))


def episode_runners(cfg: RLVRConfig, data, envs: EnvPool | None):
    """Multi-turn runs: what makes each scheduler's episode runner (train and validation share the slots)."""
    if cfg.env is None:
        return None
    e = cfg.env
    limits = EpisodeLimits(e.max_turns, e.turn_tokens, e.context_tokens, e.observation_tokens, e.window)

    def make(sampling: SamplingParams) -> EpisodeRunner:
        return EpisodeRunner(envs.slots, data.builder, limits, sampling, env_seed=lambda g: int(g.prompt.ground_truth),
                             max_failures=e.max_failures, turn_sync=e.turn_sync)
    return make


def domain_metrics(samples: list[Trajectory], reward) -> dict:
    """Per-domain reward, accuracy, share of the batch and reward latency (multi-domain runs only)."""
    if reward.single:
        return {}
    out = {}
    for name in reward.domains:
        mine = [s for s in samples if s.prompt.domain == name]
        if not mine:
            continue
        stats = sample_metrics(mine)
        if "accuracy" in stats:
            out[f"{name}/accuracy"] = stats["accuracy"]
        out.update({f"{name}/reward_mean": stats["reward/mean"], f"{name}/share": len(mine) / len(samples),
                    f"{name}/reward_latency": sum(s.reward.latency_s for s in mine) / len(mine)})
    return out


def sample_metrics(samples: list[Trajectory]) -> dict:
    """Reward, accuracy and length statistics of scored trajectories. ``accuracy`` is the share judged
    correct among the samples whose reward says (``RewardResult.correct``), absent when none does: a
    score is never read as correctness; ``reward/positive_frac`` (score > 0) is always there."""
    rewards = torch.tensor([s.reward.score for s in samples], dtype=torch.float64)
    told = [s.reward.correct for s in samples if s.reward.correct is not None]
    lengths = torch.tensor([len(s.response_ids) for s in samples], dtype=torch.float64)
    truncated = sum(1 for s in samples if s.finish_reason == "length")
    return {
        "reward/mean": float(rewards.mean()), "reward/std": float(rewards.std()) if len(samples) > 1 else 0.0,
        **({"accuracy": sum(told) / len(told)} if told else {}),
        "reward/positive_frac": float((rewards > 0).double().mean()), "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()), "response_length/truncated_frac": truncated / len(samples),
    }


@contextmanager
def _phase(timer: dict[str, float], name: str):
    start = time.perf_counter()
    try:
        yield
    finally:
        timer[name] = timer.get(name, 0.0) + time.perf_counter() - start
