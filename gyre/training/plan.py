"""The model passes one RL step runs over its batch: what ``Learner.score`` and ``Learner.update`` do, and
what ``gyre simulate`` charges a simulated step for (``StepPasses.forward_equivalents``), from one place.

Scoring runs a forward pass for each thing the step needs besides the samples: pi_old when the trainer
recomputes it (``RunPlan.old_source``: not when one optimizer step uses the batch, nor with the sampler's
log-probs), pi_ref (the reference model, or the policy with its LoRA adapters off), the distillation
teacher's log-probs, attention credit's extra policy pass, and each critic's values. The update runs
``policy.epochs`` passes of forward + backward of the policy over the batch (mini-batches split it, they
do not repeat it) and as many of each critic.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepPasses:
    old_logprobs: bool
    """The trainer recomputes pi_old with a forward pass of the policy."""
    reference: bool
    """pi_ref: a forward pass of the reference model (or of the LoRA policy with its adapters off)."""
    teacher: bool
    """On-policy distillation: a forward pass of the teacher."""
    credit: bool
    """Attention credit from the policy's attention: an extra forward pass of the policy."""
    critics: int
    """Critics, each scoring the batch (values) and training on it (AsyPPO's on their shares)."""
    epochs: int
    """Passes of each trained model over the batch (policy.epochs)."""
    checkpointing: bool
    """Gradient checkpointing: each training pass runs its forward a second time in the backward."""

    def forward_equivalents(self) -> float:
        """The step's compute in forward passes over the batch by a model of the policy's size (a backward
        is two forwards' work): 1 for each scoring pass, 3 (4 with checkpointing) per training pass."""
        train = 3 + (1 if self.checkpointing else 0)
        scoring = self.old_logprobs + self.reference + self.teacher + self.credit + self.critics
        return scoring + self.epochs * train * (1 + self.critics)


def step_passes(cfg) -> StepPasses:
    """The passes of a step of ``cfg`` (an RLVRConfig), decided as ``make_plan`` decides them (the simulator
    plans layouts a run's own placement checks would refuse, e.g. asynchrony on a colocated config)."""
    from gyre.config.derive import old_source

    a = cfg.algorithm
    return StepPasses(old_logprobs=old_source(cfg) == "recomputed", reference=a.uses_reference,
                      teacher=a.uses_teacher, credit=a.credit_spec.strategy not in ("none", "random"),
                      critics=cfg.critic.num_critics if a.uses_critic else 0, epochs=cfg.policy.epochs,
                      checkpointing=cfg.model.gradient_checkpointing)


def minibatch_rows(rows: int, mini: int, epochs: int, seed: int, step: int) -> list:
    """Row indices of each optimizer step's mini-batch of a step's ``rows`` rows (``Learner.minibatches``; the
    simulator cuts its rows so too): per epoch, a shuffle seeded by the run, the step and the epoch, cut into
    mini-batches of ``mini`` rows. Tensors of row indices."""
    import torch

    from gyre.seeding import derive_seed

    out = []
    for epoch in range(epochs):
        g = torch.Generator().manual_seed(derive_seed(seed, "minibatch", step, epoch))
        order = torch.randperm(rows, generator=g)
        out += [order[start:start + mini] for start in range(0, rows, mini)]
    return out
