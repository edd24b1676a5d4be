"""RLVR: the single-controller training loop (GRPO and every other configured algorithm).

Each step: take prompts -> generate n samples each (rollout) -> score them (reward) -> old / reference
log-probs and critic values -> advantages and masks -> optimizer steps over mini-batches (critic, policy)
-> push the new weights to the rollout engines. ``train_step`` reads top to bottom; each phase is a
named method.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from gyre.algos.aggregation import denominator_for
from gyre.cluster.reward_pool import RewardPool
from gyre.config.derive import RunPlan
from gyre.config.schema import RLVRConfig
from gyre.data.batching import gather_rows, samples_to_batch, split_for_ranks
from gyre.pipelines.advantage import AlgorithmState, correct_mismatch, estimate_advantages
from gyre.pipelines.checkpoint import CheckpointManager, DriverState, ResumeError
from gyre.pipelines.reward_checks import check_reward_failures
from gyre.pipelines.rlvr_data import RunData, config_fingerprint
from gyre.pipelines.roles import Roles, reward_scorers
from gyre.rollout.coordinator import RolloutCoordinator
from gyre.seeding import derive_seed
from gyre.tracking.progress import Progress
from gyre.tracking.tables import write_validation_table
from gyre.types import (
    GenerationRequest,
    GenerationResult,
    PromptRecord,
    Sample,
    SamplingParams,
    TrainBatch,
    TrainStepResult,
    select_rows,
)


@dataclass
class RunSummary:
    steps: int
    first_val_accuracy: float | None
    last_val_accuracy: float | None
    final_model: Path | None
    seconds: float


class RLVRPipeline:
    def __init__(self, cfg: RLVRConfig, plan: RunPlan, roles: Roles, data: RunData, logger,
                 checkpoints: CheckpointManager):
        self.cfg, self.plan, self.roles, self.data = cfg, plan, roles, data
        self.logger, self.checkpoints = logger, checkpoints
        self.rollout = RolloutCoordinator(roles.rollout, cfg.rollout.stream_parts)
        self.rewards = RewardPool(reward_scorers(cfg, roles))
        self.version = 0
        s = cfg.rollout.sampling
        self.sampling = SamplingParams(s.temperature, s.top_p, s.top_k, s.max_new_tokens, tuple(s.stop))
        # Trainer log-probs use the sampling temperature (validated > 0 for training).
        self.temperature = s.temperature
        self.reward_totals = {"errors": 0, "timeouts": 0}
        self.val_history: list[float] = []
        self.algo_state = AlgorithmState.create(cfg.algorithm)
        self.recoveries = 0
        """In-run recoveries so far (set by the launcher, which rebuilds the pipeline after a fault)."""

    # ---- the loop ---------------------------------------------------------------------------
    def run(self, resume_from: Path | None = None, echo=print) -> RunSummary:
        t0 = time.perf_counter()
        start = self.restore(resume_from, echo) if resume_from else self.begin()
        name = (self.cfg.algorithm.preset or "RL").upper()
        progress = Progress(self.cfg.run.steps, start=start, enabled=self.cfg.logging.progress, description=name)
        self.roles.watchdog.on_slow = progress.heartbeat  # a call far slower than usual shows what the run waits on
        try:
            for step in range(start + 1, self.cfg.run.steps + 1):
                metrics = self.train_step(step)
                validated = self._due(self.cfg.validation.every, step)
                if validated:
                    metrics.update(self.validate())
                self.logger.log(step, metrics)
                if validated:
                    self.write_validation_table()
                progress.update(step, {**metrics, "val/accuracy": self.val_history[-1] if self.val_history else None})
                if self._due(self.cfg.checkpoint.every, step):
                    self.save_checkpoint(step)
        finally:
            progress.close()
        final = self.save_final_model()
        return RunSummary(self.cfg.run.steps, self.val_history[0] if self.val_history else None,
                          self.val_history[-1] if self.val_history else None, final, time.perf_counter() - t0)

    def begin(self) -> int:
        """A fresh run: rollout engines get the (warmed-up) policy as version 0; validate once. With
        in-run recovery on, a checkpoint of step 0 gives a fault before the first save a place to return to."""
        self.sync_weights(0)
        if self.cfg.validation.every:
            self.logger.log(0, self.validate())
        if self.cfg.run.max_restarts:
            self.save_checkpoint(0)
        return 0

    def _due(self, every: int, step: int) -> bool:
        return bool(every) and (step % every == 0 or step == self.cfg.run.steps)

    def train_step(self, step: int) -> dict:
        timer: dict[str, float] = {}
        t_start = time.perf_counter()
        prompts = self.data.next_train_prompts(self.cfg.rollout.prompts_per_step)
        with _phase(timer, "generate"):  # rewards start on each part of the rollout as it arrives
            samples = self.generate(prompts, self.sampling, self.cfg.rollout.samples_per_prompt, ("train", step))
        with _phase(timer, "reward"):  # only what is still being scored once generation ends
            reward_stats = self.score(samples)
        batch = samples_to_batch(samples, self.data.pad_id)
        with _phase(timer, "logprobs"):
            self.compute_logprobs(batch)
        algo_metrics = self.compute_advantages(samples, batch)
        with _phase(timer, "train"):
            train_metrics = self.train_critic(batch, step)
            if step > self.cfg.algorithm.critic_warmup:
                train_metrics.update(self.train_policy(batch, step))
        with _phase(timer, "weight_sync"):
            self.sync_weights(step)
        timer["step"] = time.perf_counter() - t_start
        # Samples carry the version that generated them; the policy trained them at version step - 1.
        sample_version = min(s.result.weight_version for s in samples)
        versions = {"sample_weight_version": sample_version, "staleness/max": step - 1 - sample_version,
                    "weight_version": self.version}
        faults = {**self.rewards.metrics(), "fault/recoveries": self.recoveries}
        return {**sample_metrics(samples), **domain_metrics(samples, self.cfg.reward), **reward_stats, **algo_metrics,
                **train_metrics, **versions, **faults,
                **{f"time/{k}": v for k, v in timer.items()}}

    # ---- phases -----------------------------------------------------------------------------
    def generate(self, prompts: list[PromptRecord], params: SamplingParams, n: int, stream: tuple) -> list[Sample]:
        """Samples of every prompt, grouped by prompt; each part of the rollout is sent to the reward
        workers as soon as it arrives."""
        self.roles.timeshare.activate(self.roles.rollout_role)
        requests = [GenerationRequest(f"{stream[0]}-{stream[1]}-{i}", p.prompt_ids, params, n=n,
                                      seed=derive_seed(self.cfg.run.seed, *stream, i)) for i, p in enumerate(prompts)]
        by_request = {r.request_id: p for r, p in zip(requests, prompts)}
        samples: list[Sample] = []

        def arrived(results: list[GenerationResult]) -> None:
            part = [Sample(prompt=by_request[r.request_id], result=r, reward=None) for r in results]  # type: ignore[arg-type]
            samples.extend(part)
            self.rewards.submit(part)

        self.rollout.generate(requests, on_results=arrived, label=stream[0])
        order = {r.request_id: i for i, r in enumerate(requests)}
        samples.sort(key=lambda s: (order[s.result.request_id], s.result.sample_index))
        return samples

    def score(self, samples: list[Sample]) -> dict:
        """Wait for every sample's RewardResult; failed rewards score 0 and are counted (too many stop the run)."""
        self.rewards.wait()
        check_reward_failures(samples, self.cfg.reward)
        errors = sum(s.reward.status == "error" for s in samples)
        timeouts = sum(s.reward.status == "timeout" for s in samples)
        self.reward_totals["errors"] += errors
        self.reward_totals["timeouts"] += timeouts
        latency = [s.reward.latency_s for s in samples]
        return {"reward/errors": errors, "reward/timeouts": timeouts,
                "reward/errors_total": self.reward_totals["errors"],
                "reward/timeouts_total": self.reward_totals["timeouts"],
                "reward/latency_mean": sum(latency) / len(latency), "reward/latency_max": max(latency)}

    def compute_logprobs(self, batch: TrainBatch) -> None:
        """What the advantage stage and the losses need besides the samples: pi_old, pi_ref, values."""
        if self.plan.recompute_old_logprobs:
            self.roles.timeshare.activate("policy")
            batch.old_logprobs = self._dp_forward(self.roles.policy, "compute_logprobs", batch, self.temperature)
        if self.roles.reference is not None:
            self.roles.timeshare.activate("reference")
            batch.ref_logprobs = self._dp_forward(self.roles.reference, "compute_logprobs", batch, self.temperature)
        if self.roles.critic is not None:
            self.roles.timeshare.activate("critic")
            batch.values = self._dp_forward(self.roles.critic, "compute_values", batch)

    def compute_advantages(self, samples: list[Sample], batch: TrainBatch) -> dict:
        """Advantages, returns and loss masks (``gyre.pipelines.advantage``); samples arrive grouped by
        prompt (request order, then sample index)."""
        n = self.cfg.rollout.samples_per_prompt
        groups = [samples[i:i + n] for i in range(0, len(samples), n)]
        if any(len({s.result.request_id for s in g}) != 1 or len(g) != n for g in groups):
            raise RuntimeError("rollout results are not grouped by prompt; advantages would mix groups")
        keep, metrics = correct_mismatch(batch, self.cfg.algorithm.mismatch)
        metrics.update(estimate_advantages(batch, samples, self.cfg.algorithm, self.plan, self.algo_state, n,
                                           self.cfg.rollout.sampling.max_new_tokens, keep))
        return metrics

    def _dp_forward(self, group, method: str, batch: TrainBatch, *args) -> torch.Tensor:
        # Trainer ranks (FSDP2 collectives) need equal shards; reference workers do not.
        equal = group is self.roles.policy or group is self.roles.critic
        shards, index = split_for_ranks(batch, len(group), equal=equal)
        parts = group.call_each(method, [(shard, *args) for shard in shards])
        return gather_rows(parts, index, len(batch))

    def minibatches(self, batch: TrainBatch, step: int, ranks: int) -> tuple[list[list[TrainBatch]], list]:
        """Per-rank shards of every optimizer step's mini-batch (epochs x shuffled mini-batches) and each
        step's global loss denominator. Policy and critic see the same mini-batches."""
        mini = self.plan.mini_batch_size
        per_rank: list[list[TrainBatch]] = [[] for _ in range(ranks)]
        denoms = []
        for epoch in range(self.cfg.policy.epochs):
            g = torch.Generator().manual_seed(derive_seed(self.cfg.run.seed, "minibatch", step, epoch))
            order = torch.randperm(len(batch), generator=g)
            for start in range(0, len(batch), mini):
                minibatch = select_rows(batch, order[start:start + mini])
                denoms.append(denominator_for(minibatch.response_mask, ranks, self.plan.loss_agg_norm))
                for rank, shard in enumerate(split_for_ranks(minibatch, ranks)[0]):
                    per_rank[rank].append(shard)
        return per_rank, denoms

    def train_policy(self, batch: TrainBatch, step: int) -> dict:
        self.roles.timeshare.activate("policy")
        per_rank, denoms = self.minibatches(batch, step, self.plan.dp_size)
        a = self.cfg.algorithm
        old_source = "recomputed" if self.plan.recompute_old_logprobs else (
            "rollout" if a.old_logprobs == "rollout" else "current")
        spec = a.loss_spec(self.temperature, old_source)
        results = self.roles.policy.call_each("train", [(shards, denoms, spec) for shards in per_rank])
        return TrainStepResult.summarize(results)

    def train_critic(self, batch: TrainBatch, step: int) -> dict:
        if self.roles.critic is None:
            return {}
        self.roles.timeshare.activate("critic")
        per_rank, denoms = self.minibatches(batch, step, self.plan.critic_dp_size)
        a = self.cfg.algorithm
        results = self.roles.critic.call_each("train", [(shards, denoms, a.value_clip, a.loss_agg)
                                                        for shards in per_rank])
        out = TrainStepResult.summarize(results)
        return {**{k: v for k, v in out.items() if k.startswith("critic/")}, "critic/grad_norm": out["grad_norm"],
                "critic/lr": out["lr"]}

    def sync_weights(self, version: int) -> None:
        """Push the trainer's weights to every rollout engine as ``version``; verify they took it.
        Hybrid engines sample with the training weights themselves: only their version stamp moves."""
        if self.roles.hybrid:
            versions = self.roles.policy.call("set_weight_version", version)
        else:
            exported = self.roles.policy.call("export_weights", version, self.cfg.model.dtype)
            self.roles.timeshare.activate("rollout")
            versions = self.roles.rollout.call("load_weights", exported[0])
        if any(v != version for v in versions):
            raise RuntimeError(f"weight sync failed: rollout workers report versions {versions}, expected {version}")
        self.version = version

    def validate(self) -> dict:
        v = self.cfg.validation
        params = SamplingParams(v.temperature, 1.0, 0, self.sampling.max_new_tokens, self.sampling.stop)
        samples = self.generate(self.data.val_prompts, params, v.samples_per_prompt, ("val", 0))
        self.score(samples)
        metrics = {f"val/{k}": val for k, val in {**sample_metrics(samples),
                                                   **domain_metrics(samples, self.cfg.reward)}.items()}
        self.val_history.append(metrics["val/accuracy"])
        return metrics

    def write_validation_table(self) -> None:
        """validation.md: held-out accuracy at every validation so far, overall and per domain."""
        domains = [] if self.cfg.reward.single else list(self.cfg.reward.domains)
        out = Path(self.cfg.run.output_dir)
        write_validation_table(out / "metrics.jsonl", out / "validation.md", domains)

    # ---- persistence --------------------------------------------------------------------------
    def save_checkpoint(self, step: int) -> None:
        tmp = self.checkpoints.begin(step)
        self.roles.policy.call("save_checkpoint", str(tmp / "policy"))
        if self.roles.critic is not None:
            (tmp / "critic").mkdir()
            self.roles.critic.call("save_checkpoint", str(tmp / "critic"))
        state = DriverState(step=step, data=self.data.train_sampler.state_dict(), weight_version=self.version,
                            run_steps=self.cfg.run.steps, config_hash=config_fingerprint(self.cfg),
                            reward_totals=dict(self.reward_totals), val_history=list(self.val_history),
                            algorithm={**self.algo_state.to_dict(), "rewards": self.rewards.state_dict()})
        self.checkpoints.commit(tmp, state)

    def restore(self, path: Path, echo=print) -> int:
        """Continue from checkpoint ``path``: trainer state, data position, counters, rollout weights."""
        state = self.checkpoints.load_state(path)
        if state.config_hash != config_fingerprint(self.cfg):
            echo("warning: the config differs from the checkpointed run's (beyond run.steps and logging)")
        if state.run_steps != self.cfg.run.steps:
            echo(f"note: run.steps changed from {state.run_steps} to {self.cfg.run.steps}: the LR schedule now spans "
                 "the new length")
        self.roles.policy.call("load_checkpoint", str(path / "policy"))
        if self.roles.critic is not None:
            self.roles.critic.call("load_checkpoint", str(path / "critic"))
        self.algo_state.load_dict(state.algorithm)
        self.rewards.load_state_dict(state.algorithm.get("rewards", {}))
        try:
            self.data.train_sampler.load_state_dict(state.data)
        except ValueError as exc:
            raise ResumeError(f"cannot resume from {path}: {exc}") from None
        self.reward_totals.update(state.reward_totals)
        self.val_history = list(state.val_history)
        self.sync_weights(state.weight_version)
        return state.step

    def save_final_model(self) -> Path:
        out = Path(self.cfg.run.output_dir) / "final_model"
        tok = self.cfg.model.tokenizer_path or self.cfg.model.path
        self.roles.policy.call("save_hf", str(out), tok)
        return out


def domain_metrics(samples: list[Sample], reward) -> dict:
    """Per-domain reward, accuracy, share of the batch and reward latency (multi-domain runs only)."""
    if reward.single:
        return {}
    out = {}
    for name in reward.domains:
        mine = [s for s in samples if s.prompt.domain == name]
        if not mine:
            continue
        stats = sample_metrics(mine)
        out.update({f"{name}/reward_mean": stats["reward/mean"], f"{name}/accuracy": stats["accuracy"],
                    f"{name}/share": len(mine) / len(samples),
                    f"{name}/reward_latency": sum(s.reward.latency_s for s in mine) / len(mine)})
    return out


def sample_metrics(samples: list[Sample]) -> dict:
    """Reward, accuracy and length statistics of scored samples."""
    rewards = torch.tensor([s.reward.score for s in samples], dtype=torch.float64)
    correct = [s.reward.correct if s.reward.correct is not None else s.reward.score > 0 for s in samples]
    lengths = torch.tensor([len(s.result.response_ids) for s in samples], dtype=torch.float64)
    truncated = sum(1 for s in samples if s.result.finish_reason == "length")
    return {
        "reward/mean": float(rewards.mean()), "reward/std": float(rewards.std()) if len(samples) > 1 else 0.0,
        "accuracy": sum(correct) / len(samples), "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()), "response_length/truncated_frac": truncated / len(samples),
    }


@contextmanager
def _phase(timer: dict[str, float], name: str):
    start = time.perf_counter()
    try:
        yield
    finally:
        timer[name] = timer.get(name, 0.0) + time.perf_counter() - start
