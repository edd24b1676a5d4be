"""``gyre dpo``: a standalone preference-optimisation run (DPO and its variants) on the policy trainer ranks.

It reads top to bottom like ``gyre sft`` (the frame is ``gyre.app.standalone``): paths resolved and the
model's headers checked, every pair tokenised (a bad row fails here, before Ray), the output directory
claimed, then Ray, the reference log-probs, the policy trainer ranks (``PolicyWorker``: the RL policy's and
``gyre sft``'s backend), the DPO loop (``gyre.pipelines.dpo.run_dpo``) and the final model, saved as
``gyre sft`` saves it. Metrics go to ``metrics.jsonl`` (phase "dpo", TRL's metric names) and TensorBoard.

The reference. DPO scores each pair by how much more the policy prefers the chosen completion than the
reference model (the starting model) does. The reference never changes, so each pair's reference
log-probs are computed once, before training (TRL's ``precompute_ref_log_probs``), by a reference role on
the policy's own devices, which is then killed: the policy trains with the whole device memory, holding no
second model, and each step runs the policy's forward and backward passes alone. With LoRA the reference
is the policy's base model with its adapters off (``PolicyWorker.compute_ref_logprobs``), so no second
copy is loaded at all. SimPO is reference-free: no reference log-probs are computed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gyre.app.rundir import RunMode
from gyre.config.derive import SFTPlan
from gyre.config.dpo_schema import DPOJobConfig
from gyre.data.preference import PreferencePair


@dataclass
class DPOSummary:
    steps: int
    pairs: int
    first_loss: float | None
    last_loss: float | None
    first_accuracy: float | None
    """rewards/accuracies of the first step: the fraction of its pairs whose chosen completion the policy
    already prefers more than the reference does (0 at the start, when the two are equal)."""
    last_accuracy: float | None
    final_model: Path
    seconds: float


def train_dpo(cfg: DPOJobConfig, address: str | None = None, mode: RunMode = "fresh",
              echo: Callable[[str], None] = print) -> DPOSummary:
    """Run ``cfg``; ``mode`` says what to do with a run already in run.output_dir (fresh or overwrite:
    DPO runs keep no checkpoints to resume)."""
    from gyre.app.standalone import resolve_paths, standalone_run
    from gyre.config.derive import make_dpo_plan

    return standalone_run(resolve_paths(cfg, "dpo"), address, mode, echo, make_dpo_plan, load_pairs, _run, "DPO")


def load_pairs(cfg: DPOJobConfig, echo: Callable[[str], None]) -> tuple[list[PreferencePair], int]:
    """Every pair, tokenised and masked; and the pad id."""
    from gyre.app.standalone import renderer_for
    from gyre.data.preference import PreferenceColumns, load_preference_pairs

    dpo, renderer = cfg.dpo, renderer_for(cfg, "dpo")
    tokenizer = renderer.tokenizer
    pairs, count = load_preference_pairs(dpo.train_files, renderer, int(tokenizer.eos_token_id), dpo.max_tokens,
                                         PreferenceColumns.from_config(dpo), dpo.overlong)
    sequences = [e for p in pairs for e in (p.chosen, p.rejected)]
    trained, total = sum(sum(e.loss_mask) for e in sequences), sum(len(e.input_ids) for e in sequences)
    echo(f"data: {len(pairs)} preference pairs, {total} tokens of which {trained} in completions "
         f"({trained / total:.0%}){count.describe(dpo.max_tokens)}; loss {dpo.loss_type}, beta {dpo.beta}")
    return pairs, int(tokenizer.pad_token_id)


def _run(cfg: DPOJobConfig, plan: SFTPlan, data: tuple[list[PreferencePair], int],
         echo: Callable[[str], None]) -> DPOSummary:
    from gyre.app.standalone import first_and_last, trainer_session
    from gyre.cluster.workers import PolicyWorker
    from gyre.pipelines.dpo import reference_logprobs, run_dpo
    from gyre.pipelines.sft import SFTTrainer

    t0 = time.perf_counter()
    pairs, pad_id = data
    rows = 2 * cfg.dpo.micro_batch_size  # a forward pass holds micro_batch_size whole pairs
    with trainer_session(cfg, plan, "DPO") as session:
        if "reference" in plan.roles:
            _reference_role(session, pairs, pad_id, rows, echo)
        policy = session.start_policy(rows)
        if plan.reference and "reference" not in plan.roles:  # LoRA: the policy's base model, adapters off
            start = time.perf_counter()
            reference_logprobs(pairs, policy, PolicyWorker.compute_ref_logprobs, pad_id)
            echo(f"reference: log-probs of {len(pairs)} pairs ({time.perf_counter() - start:.1f} s, base model)")
        run_dpo(cfg.dpo, pairs, SFTTrainer(policy, plan.dp_size), pad_id, cfg.run.seed, session.logger,
                session.progress)
        final = session.save_final(policy)
    out = cfg.run.output_dir
    return DPOSummary(plan.steps, len(pairs), *first_and_last(out, "dpo", "dpo_loss"),
                      *first_and_last(out, "dpo", "rewards/accuracies"), final, time.perf_counter() - t0)


def _reference_role(session, pairs: list[PreferencePair], pad_id: int, rows: int,
                    echo: Callable[[str], None]) -> None:
    """Every pair's reference log-probs from a frozen copy of the model on the policy's devices, which is
    killed afterwards (its device memory goes back before the policy loads)."""
    from gyre.cluster.workers import ReferenceWorker
    from gyre.pipelines.dpo import reference_logprobs

    m, plan = session.cfg.model, session.plan
    start = time.perf_counter()
    reference = session.start("reference", ReferenceWorker, lambda r: (
        r, m.path, m.dtype, m.trust_remote_code, plan.device_kind, plan.threads_per_worker, rows, False,
        m.attn_implementation, session.cfg.policy.levers))
    try:
        reference_logprobs(pairs, reference, ReferenceWorker.compute_logprobs, pad_id)
    finally:
        reference.kill()
        session.groups.remove(reference)
    echo(f"reference: log-probs of {len(pairs)} pairs ({time.perf_counter() - start:.1f} s), reference role "
         "released")
