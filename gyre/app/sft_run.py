"""``gyre sft``: a standalone supervised fine-tuning run on the policy trainer ranks.

It reads top to bottom like ``gyre train`` (the frame is ``gyre.app.standalone``, shared with ``gyre
dpo``): paths resolved and the model's headers checked, every example tokenised and masked (a bad row fails
here, before Ray), the plan (its length: ``sft.steps``, or ``sft.epochs`` over the examples), the output
directory claimed, then Ray, the trainer ranks (``PolicyWorker``, DDP or FSDP2, LoRA when policy.lora is
set: the RL policy's own backend), the shared SFT loop (``gyre.pipelines.sft.run_sft``), and the final
model saved as ``gyre train`` saves it (the input's dtype, the user's tokenizer files). Metrics go to
``metrics.jsonl`` (phase "sft") and TensorBoard.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gyre.app.rundir import RunMode
from gyre.config.derive import SFTPlan
from gyre.config.sft_schema import SFTJobConfig
from gyre.data.sft import SFTExample


@dataclass
class SFTSummary:
    steps: int
    examples: int
    first_loss: float | None
    last_loss: float | None
    final_model: Path
    seconds: float


def train_sft(cfg: SFTJobConfig, address: str | None = None, mode: RunMode = "fresh",
              echo: Callable[[str], None] = print) -> SFTSummary:
    """Run ``cfg``; ``mode`` says what to do with a run already in run.output_dir (fresh or overwrite:
    SFT runs keep no checkpoints to resume)."""
    from gyre.app.standalone import resolve_paths, standalone_run
    from gyre.config.derive import make_sft_plan

    return standalone_run(resolve_paths(cfg, "sft"), address, mode, echo, make_sft_plan, load_examples, _run, "SFT")


def load_examples(cfg: SFTJobConfig, echo: Callable[[str], None]) -> tuple[list[SFTExample], int]:
    """Every example, tokenised and masked; and the pad id."""
    from gyre.app.standalone import renderer_for
    from gyre.data.sft import SFTColumns, load_sft_examples

    sft, renderer = cfg.sft, renderer_for(cfg, "sft")
    tokenizer = renderer.tokenizer
    examples, dropped = load_sft_examples(sft.train_files, renderer, int(tokenizer.eos_token_id), sft.max_tokens,
                                          SFTColumns.from_config(sft, "sft"), sft.overlong)
    trained = sum(sum(e.loss_mask) for e in examples)
    total = sum(len(e.input_ids) for e in examples)
    echo(f"data: {len(examples)} examples, {total} tokens of which {trained} trained ({trained / total:.0%})"
         + (f"; {dropped} dropped (longer than sft.max_tokens={sft.max_tokens})" if dropped else ""))
    return examples, int(tokenizer.pad_token_id)


def _run(cfg: SFTJobConfig, plan: SFTPlan, data: tuple[list[SFTExample], int], echo) -> SFTSummary:
    from gyre.app.standalone import first_and_last, trainer_session
    from gyre.pipelines.sft import SFTTrainer, run_sft

    t0 = time.perf_counter()
    examples, pad_id = data
    with trainer_session(cfg, plan, "SFT") as session:
        policy = session.start_policy(cfg.sft.micro_batch_size)
        run_sft(cfg.sft, examples, SFTTrainer(policy, plan.dp_size), pad_id, cfg.run.seed, session.logger,
                session.progress)
        final = session.save_final(policy)
    first, last = first_and_last(cfg.run.output_dir, "sft", "sft_loss")
    return SFTSummary(plan.steps, len(examples), first, last, final, time.perf_counter() - t0)
