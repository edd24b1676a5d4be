"""What a simulated training step costs: the real learner's passes, cut into the real micro-batches.

A step runs the passes ``gyre.training.plan.step_passes`` names (what ``Learner.score`` and
``Learner.update`` run): scoring passes over the whole batch (pi_old when the trainer recomputes it, pi_ref,
the teacher, attention credit, each critic's values), then each critic's update and the policy's (after
the critic's warm-up): policy.epochs x the mini-batches, one optimizer step each (``minibatch_rows``, the
learner's own seeded shuffle). Every pass is cut as the run cuts it, by the run's own functions on the
simulated row lengths: the rows are balanced over the role's ranks (``gyre.data.batching.balanced_rows``;
trainer ranks take equal shares where the rows divide evenly, as a run's batch is padded to), and each
rank cuts its share into micro-batches (``gyre.engines.microbatch.plan_micro_batches``: micro_batch_size
rows or the micro_batch_tokens budget, remove_padding none / sort / pack; FSDP2 ranks run as many as the
busiest, ``split_to_count``). A micro-batch computes its rows' tokens packed, else rows x its longest row.

The ranks meet at every optimizer step (the gradient reduction) and at the end of a scoring pass, so each
takes its busiest rank's time: a forward 2 P FLOPs a token, a backward 4 P (under gradient checkpointing
one forward more), P the parameters of the model that runs it (the critic has no LM head; a teacher or a
critic from another model directory its own shape), at the device's training MFU, plus the device class's
fixed cost of a step (``CostModel.train_compute_s``). Attention's FLOPs (quadratic in a row's length) and
FSDP2's per-micro-batch gathers are left out, as the roofline of decoding leaves them out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gyre.config.catalog import ModelShape
from gyre.data.batching import balanced_rows
from gyre.engines.microbatch import plan_micro_batches, split_to_count
from gyre.engines.specs import MemoryLevers
from gyre.training.plan import StepPasses, minibatch_rows, step_passes

FORWARD, TRAIN = 1, 3
"""Forward-equivalents of a scoring pass and of a training pass (forward + backward, 2 + 4 P FLOPs a token)."""


@dataclass(frozen=True)
class Cut:
    """How one role's ranks cut a pass over a batch, and the size of the model that runs it."""

    params: float
    ranks: int
    rows: int
    """Rows per micro-batch when ``levers.micro_batch_tokens`` is unset (the section's micro_batch_size)."""
    levers: MemoryLevers = MemoryLevers()
    trainer: bool = True
    """Data-parallel trainer ranks take equal shares (forward-only workers within a row of each other)."""
    fsdp: bool = False
    """FSDP2 ranks run as many micro-batches as the busiest one."""

    def busiest(self, lengths: Sequence[int]) -> int:
        """Tokens the busiest rank computes in one pass over rows of ``lengths`` tokens."""
        if not lengths:
            return 0
        equal = self.trainer and len(lengths) % self.ranks == 0
        shares = [[lengths[i] for i in rows] for rows in balanced_rows(lengths, self.ranks, equal)]
        if self.levers.pack:  # packed micro-batches compute their rows and nothing else, however they are cut
            return max(sum(share) for share in shares)
        plans = [self._groups(share) for share in shares]
        if self.fsdp and self.ranks > 1:
            count = max(len(p) for p in plans)
            plans = [split_to_count(p, min(count, len(s))) if s else p for p, s in zip(plans, shares, strict=True)]
        return max(sum(len(g) * max(share[i] for i in g.tolist()) for g in plan)
                   for plan, share in zip(plans, shares, strict=True) if share)

    def _groups(self, share: list[int]) -> list:
        import torch

        if not share:
            return []
        if self.levers.micro_batch_tokens is None and len(share) <= self.rows:  # one micro-batch, however ordered
            return [torch.arange(len(share))]
        return plan_micro_batches(torch.tensor(share), self.rows, self.levers)


@dataclass(frozen=True)
class SimLearner:
    """A step's passes (``StepPasses``) and how each role cuts them."""

    passes: StepPasses
    policy: Cut
    reference: Cut | None = None
    """The reference's cut (None: no reference; LoRA's is the policy's own, adapters off)."""
    teacher: Cut | None = None
    critic: Cut | None = None
    mini_batch_size: int = 0
    """policy.mini_batch_size of a full batch of ``rollout_batch`` rows (0: the whole batch)."""
    rollout_batch: int = 0
    critic_warmup: int = 0
    """The policy trains from the step after this one (algorithm.critic.warmup); its critics from the first."""
    division: str = "group_response_split"
    """How several critics share a batch (algorithm.critic.data_division)."""
    seed: int = 0
    """The run's seed: the mini-batch shuffles (run.seed)."""

    def step_flops(self, lengths: Sequence[int], step: int, groups: Sequence[int] | None = None) -> float:
        """FLOPs of step ``step`` on its busiest device, over rows of ``lengths`` tokens (``groups``: each
        row's prompt group, which several critics divide the batch by; default one group a row)."""
        p = self.passes
        scoring = [(self.policy, p.old_logprobs), (self.reference, p.reference), (self.teacher, p.teacher),
                   (self.policy, p.credit), *[(self.critic, True)] * p.critics]
        flops = sum(2 * FORWARD * cut.params * cut.busiest(lengths) for cut, runs in scoring if runs and cut)
        train = TRAIN + (1 if p.checkpointing else 0)
        for share in self._critic_shares(lengths, groups):
            flops += sum(2 * train * self.critic.params * self.critic.busiest(rows)
                         for rows in self._minibatches(share, step))
        if not p.critics or step > self.critic_warmup:
            flops += sum(2 * train * self.policy.params * self.policy.busiest(rows)
                         for rows in self._minibatches(list(lengths), step))
        return flops

    def describe(self) -> str:
        """The step's passes in a line, e.g. ``8 ranks: pi_ref forward; 1 epoch x 4 mini-batches of forward +
        backward; micro-batches <= 16384 tokens, rows packed without padding``."""
        p = self.passes
        scoring = [name for name, runs in (("pi_old", p.old_logprobs), ("pi_ref", p.reference),
                                           ("teacher", p.teacher), ("credit", p.credit)) if runs]
        if p.critics:
            scoring.append("critic values" if p.critics == 1 else f"{p.critics} critics' values")
        minis = max(1, self.rollout_batch // (self.mini_batch_size or self.rollout_batch or 1))
        trained = "policy" + (f" and {'critic' if p.critics == 1 else f'{p.critics} critics'}" if p.critics else "")
        update = (f"{p.epochs} epoch(s) x {minis} mini-batch(es) of forward + backward of the {trained}"
                  + (" (checkpointing: the forward again)" if p.checkpointing else ""))
        cut = self.policy
        return (f"{cut.ranks} rank(s){' (fsdp2)' if cut.fsdp else ''}: "
                + (f"{' + '.join(scoring)} forward; " if scoring else "") + update + "; "
                + cut.levers.describe(cut.rows, logprobs=False))

    def _minibatches(self, lengths: list[int], step: int) -> list[list[int]]:
        mini = max(1, len(lengths) * (self.mini_batch_size or self.rollout_batch) // max(1, self.rollout_batch))
        if not lengths:
            return []
        return [[lengths[i] for i in rows.tolist()]
                for rows in minibatch_rows(len(lengths), mini, self.passes.epochs, self.seed, step)]

    def _critic_shares(self, lengths: Sequence[int], groups: Sequence[int] | None) -> list[list[int]]:
        """Each critic's rows: the whole batch for PPO's one; AsyPPO's disjoint shares (``critic_rows``)."""
        m = self.passes.critics
        if m <= 1:
            return [list(lengths)] * m
        import torch

        from gyre.algos.asyppo import critic_rows

        index = torch.tensor(list(groups) if groups is not None else range(len(lengths)), dtype=torch.long)
        return [[lengths[i] for i in rows.tolist()] for rows in critic_rows(index, m, self.division)]


def sim_learner(cfg, train_devices: int, shape: ModelShape) -> SimLearner:
    """The learner of ``cfg`` (an RLVRConfig) on ``train_devices`` ranks, the policy of ``shape``: every
    trainer role (policy, reference, teacher, critics) on the training devices, one rank or worker each."""
    passes = step_passes(cfg)
    a, pol = cfg.algorithm, cfg.policy
    policy = Cut(shape.params, train_devices, pol.micro_batch_size, pol.levers, fsdp=pol.strategy == "fsdp2")
    reference = None
    if passes.reference:
        r = cfg.reference
        reference = policy if pol.lora is not None else Cut(shape.params, train_devices, r.micro_batch_size,
                                                            r.levers, trainer=False)
    teacher = None
    if passes.teacher:
        t = cfg.teacher
        teacher = Cut(_shape(t.model_path, shape).params, train_devices, t.micro_batch_size, t.levers, trainer=False)
    critic = None
    if passes.critics:
        c = cfg.critic
        backbone = _shape(c.model_path, shape)
        params = backbone.params - backbone.vocab * backbone.hidden_size  # a value head instead of the LM head
        critic = Cut(params, train_devices, c.micro_batch_size, c.levers, fsdp=c.strategy == "fsdp2")
    r = cfg.rollout
    return SimLearner(passes, policy, reference, teacher, critic, pol.mini_batch_size or 0,
                      r.prompts_per_step * r.samples_per_prompt, a.critic.warmup, a.critic.data_division,
                      cfg.run.seed)


def _shape(path: str | None, policy: ModelShape) -> ModelShape:
    """A model directory's shape when it is here (its config.json), else the policy's."""
    if path and (Path(path).expanduser() / "config.json").is_file():
        return ModelShape.from_hf_config(Path(path).expanduser())
    return policy
