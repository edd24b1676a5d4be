"""The driver's side of the models that learn or score: policy, reference and critic role groups.

The pipeline asks the learner for what it needs by name (``score`` a batch with pi_old, pi_ref and values,
``update`` the critic and the policy, ``export`` the new weights, ``save`` / ``restore``) and never touches
the role groups itself. Mini-batches are cut here, on the driver, so every rank and every role sees the
same ones, with global loss denominators (the result does not depend on the number of ranks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from gyre.algos.aggregation import denominator_for
from gyre.algos.asyppo import aggregate_values
from gyre.cluster.channel import ChannelPublication, ChannelSpec, ChannelWeights
from gyre.cluster.group import Method
from gyre.cluster.weights import WeightManifest
from gyre.cluster.workers import WEIGHTS, CriticWorker, PolicyWorker, ReferenceWorker
from gyre.config.derive import RunPlan
from gyre.config.schema import RLVRConfig
from gyre.data.batching import gather_rows, split_for_ranks
from gyre.seeding import derive_seed
from gyre.training.plan import minibatch_rows, step_passes
from gyre.types import TrainBatch, TrainStepResult, select_rows


class Learner:
    def __init__(self, cfg: RLVRConfig, plan: RunPlan, roles, wait: Callable | None = None):
        """``roles``: the run's ``gyre.cluster.roles.Roles`` (policy, reference, critic, time-share).
        ``wait(group, method, refs)``, when given, is called while each call runs (the asynchronous
        pipeline carries the rollout on meanwhile); the results are then gathered with their deadline."""
        self.cfg, self.plan = cfg, plan
        self.passes = step_passes(cfg)
        """The passes each step runs (``gyre.training.plan``; the simulator charges the same)."""
        self.wait = wait
        self.policy, self.reference = roles.policy, roles.reference
        self.critics = dict(zip(plan.critic_roles, roles.critics, strict=True))
        """The critic role groups by role name: none, PPO's one, or AsyPPO's several."""
        self.teacher = roles.teacher
        self.timeshare = roles.timeshare
        self.hybrid = roles.hybrid
        # Trainer log-probs use the sampling temperature (validated > 0 for training).
        self.temperature = cfg.rollout.sampling.temperature
        self.channel: ChannelSpec | None = None
        """The weight channel's current generation (``rollout.weight_transport``), None: the object store."""
        if plan.weight_transport == "channel":
            ref = self.policy.submit_to(0, PolicyWorker.open_weight_channel, len(roles.rollout),
                                        cfg.rollout.weight_sync_timeout_s)
            self.channel = self.policy.gather([ref], PolicyWorker.open_weight_channel, ranks=[0])[0]

    # ---- scoring ----------------------------------------------------------------------------------
    def score(self, batch: TrainBatch) -> None:
        """What the advantage stage and the losses need besides the samples: pi_old, pi_ref, the teacher's
        log-probs, values."""
        passes = self.passes
        if passes.old_logprobs:
            self.timeshare.activate("policy")
            batch.old_logprobs = self._forward(self.policy, PolicyWorker.compute_logprobs, batch, self.temperature)
        if passes.reference and self.plan.reference_on_policy:  # LoRA: the policy's base, adapters switched off
            self.timeshare.activate("policy")
            batch.ref_logprobs = self._forward(self.policy, PolicyWorker.compute_ref_logprobs, batch, self.temperature)
        elif passes.reference:
            self.timeshare.activate("reference")
            batch.ref_logprobs = self._forward(self.reference, ReferenceWorker.compute_logprobs, batch,
                                               self.temperature)
        credit = self.cfg.algorithm.credit_spec
        if credit.strategy != "none":
            batch.credit_scales = self._credit_scales(batch, credit)
        if passes.teacher:  # on-policy distillation: the teacher scores the student's tokens
            self.timeshare.activate("teacher")
            batch.teacher_logprobs = self._forward(self.teacher, ReferenceWorker.compute_logprobs, batch,
                                                   self.temperature)
        values = []
        for name, critic in self.critics.items():
            self.timeshare.activate(name)
            values.append(self._forward(critic, CriticWorker.compute_values, batch))
        if len(values) == 1:
            batch.values = values[0]
        elif values:  # AsyPPO: GAE on the critics' aggregate; the advantage stage ranks their disagreement
            batch.critic_values = torch.stack(values, dim=1)
            how = self.cfg.algorithm.critic.value_aggregation
            batch.values, _ = aggregate_values(batch.critic_values.transpose(0, 1), how)

    def _credit_scales(self, batch: TrainBatch, spec) -> torch.Tensor:
        """Attention-based credit's gamma [B, L]: the random baseline here (seeded by the run and the batch's
        tokens, so a run repeats), the others from an extra pass of the policy over the batch."""
        if spec.strategy == "random":
            from gyre.algos.attention_credit import random_scales

            seed = derive_seed(self.cfg.run.seed, "credit", int(batch.input_ids.sum()))
            return random_scales(batch.response_mask, spec, torch.Generator().manual_seed(seed))
        self.timeshare.activate("policy")
        return self._forward(self.policy, PolicyWorker.compute_credit_scales, batch, spec, self.temperature)

    def _forward(self, group, method: Method, batch: TrainBatch, *args) -> torch.Tensor:
        # Trainer ranks (FSDP2 collectives) need equal shards; reference workers do not.
        equal = group is self.policy or any(group is c for c in self.critics.values())
        shards, index = split_for_ranks(batch, len(group), equal=equal)
        parts = self._call_each(group, method, [(shard, *args) for shard in shards])
        return gather_rows(parts, index, len(batch))

    def _call_each(self, group, method: Method, per_rank: Sequence[tuple]) -> list:
        refs = group.submit_each(method, per_rank)
        if self.wait is not None:
            self.wait(group, method, refs)
        return group.gather(refs, method)

    # ---- updates ----------------------------------------------------------------------------------
    def update(self, batch: TrainBatch, step: int) -> dict:
        """The critic's optimizer steps, then the policy's once the critic has warmed up; their metrics."""
        metrics = self._train_critic(batch, step)
        if step > self.cfg.algorithm.critic.warmup:
            metrics.update(self._train_policy(batch, step))
        return metrics

    def minibatches(self, batch: TrainBatch, step: int, ranks: int) -> tuple[list[list[TrainBatch]], list]:
        """Per-rank shards of every optimizer step's mini-batch (epochs x shuffled mini-batches) and each
        step's global loss denominator. Policy and critic see the same mini-batches; their count is fixed,
        their rows are the batch's share (step-level samples make batches of varying size)."""
        mini = len(batch) * self.plan.mini_batch_size // self.plan.rollout_batch
        per_rank: list[list[TrainBatch]] = [[] for _ in range(ranks)]
        denoms = []
        for rows in minibatch_rows(len(batch), mini, self.cfg.policy.epochs, self.cfg.run.seed, step):
            minibatch = select_rows(batch, rows)
            denoms.append(denominator_for(minibatch.response_mask, ranks, self.plan.loss_agg_norm))
            for rank, shard in enumerate(split_for_ranks(minibatch, ranks)[0]):
                per_rank[rank].append(shard)
        return per_rank, denoms

    def _train_policy(self, batch: TrainBatch, step: int) -> dict:
        self.timeshare.activate("policy")
        batch = dataclasses.replace(batch, critic_values=None)  # the critics' business, not the policy's
        per_rank, denoms = self.minibatches(batch, step, self.plan.dp_size)
        a = self.cfg.algorithm
        spec = a.loss_spec(self.temperature, self.plan.old_source)
        results = self._call_each(self.policy, PolicyWorker.train, [(shards, denoms, spec) for shards in per_rank])
        return TrainStepResult.summarize(results)

    def _train_critic(self, batch: TrainBatch, step: int) -> dict:
        if len(self.critics) == 1:
            return self._train_one_critic("critic", batch, step)
        metrics: dict[str, float] = {}
        for m, name in enumerate(self.critics):  # AsyPPO: critic m trains on its share alone, on its own values
            rows = (batch.critic_index == m).nonzero().squeeze(1)
            share = select_rows(batch, rows)
            share = dataclasses.replace(share, values=share.critic_values[:, m], critic_values=None)
            out = self._train_one_critic(name, share, step)
            metrics.update({k.replace("critic/", f"critic/{m}/", 1): v for k, v in out.items()})
        if metrics:
            metrics["critic/value_loss"] = sum(metrics[f"critic/{m}/value_loss"]
                                               for m in range(len(self.critics))) / len(self.critics)
        return metrics

    def _train_one_critic(self, name: str, batch: TrainBatch, step: int) -> dict:
        """One critic role's optimizer steps on ``batch``; its metrics under critic/."""
        self.timeshare.activate(name)
        per_rank, denoms = self.minibatches(batch, step, self.plan.critic_dp_size)
        a = self.cfg.algorithm
        results = self._call_each(self.critics[name], CriticWorker.train,
                                  [(shards, denoms, a.critic.value_clip, a.loss.agg) for shards in per_rank])
        out = TrainStepResult.summarize(results)
        return {**{k: v for k, v in out.items() if k.startswith("critic/")}, "critic/grad_norm": out["grad_norm"],
                "critic/lr": out["lr"]}

    # ---- weights and persistence ------------------------------------------------------------------
    def export(self, version: int):
        """The policy's weights for the rollout engines as ``version`` (a ``WeightBundle`` per rank's share);
        None when the engines are the policy's own ranks (hybrid: nothing to copy)."""
        if self.hybrid:
            return None
        if self.channel is None:
            return self.policy.call(PolicyWorker.export_weights, version, self.cfg.model.dtype)[0]
        manifest = self.policy.call(PolicyWorker.stage_weights, version, self.cfg.model.dtype)[0]
        return self._publication(manifest)

    def _publication(self, manifest: WeightManifest) -> ChannelPublication:
        """A version staged on the policy's rank 0, for the rollout driver to load over the channel's current
        generation (a failure renews it) or through the object store."""
        policy = self.policy

        def start():
            weights = ChannelWeights(manifest, self.channel)
            return weights, policy.submit_to(0, PolicyWorker.send_weights, weights.spec, manifest.version, lane=WEIGHTS)

        def failed(weights: ChannelWeights) -> None:
            policy.submit_to(0, PolicyWorker.abort_weights, weights.spec.generation, probe=True)
            if self.channel.generation == weights.spec.generation:
                self.channel = self.channel.renewed()

        def to_store() -> list:
            ref = policy.submit_to(0, PolicyWorker.staged_bundle, manifest.version)
            return policy.gather([ref], PolicyWorker.staged_bundle, ranks=[0])[0]

        return ChannelPublication(manifest, start, lambda ref: policy.gather([ref], PolicyWorker.send_weights,
                                                                            ranks=[0])[0], to_store, failed)

    def save(self, directory: Path) -> None:
        """Trainer states (weights, optimizer, scheduler, RNG) of the policy and the critic under ``directory``."""
        self.policy.call(PolicyWorker.save_checkpoint, str(directory / "policy"))
        for name, critic in self.critics.items():  # critic/, or critic.0/ ... for several
            (directory / name).mkdir()
            critic.call(CriticWorker.save_checkpoint, str(directory / name))

    def restore(self, directory: Path) -> None:
        self._check_lora_checkpoint(directory / "policy")
        self.policy.call(PolicyWorker.load_checkpoint, str(directory / "policy"))
        for name, critic in self.critics.items():
            critic.call(CriticWorker.load_checkpoint, str(directory / name))

    def save_model(self, directory: Path | None, tokenizer_path: str, dtype: str,
                   adapter_directory: Path | None = None) -> None:
        """The policy as a Hugging Face model directory in ``dtype`` (LoRA: merged), with the tokenizer
        files of ``tokenizer_path`` copied unchanged; with LoRA, the adapter (peft's format) in
        ``adapter_directory`` too. None writes nothing there."""
        self.policy.call(PolicyWorker.save_hf, None if directory is None else str(directory), tokenizer_path, dtype,
                         None if adapter_directory is None else str(adapter_directory))

    def _check_lora_checkpoint(self, directory: Path) -> None:
        """A LoRA checkpoint holds adapters only, a full one every weight: each needs the run it came from."""
        from gyre.models.lora import resume_problem
        from gyre.training.checkpoint import ResumeError

        problem = resume_problem(directory, self.cfg.policy.lora and self.cfg.policy.lora.spec())
        if problem:
            raise ResumeError(f"cannot resume from {directory.parent}: {problem}")
