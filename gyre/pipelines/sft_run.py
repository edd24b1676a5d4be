"""``gyre sft``: a standalone supervised fine-tuning run on the policy trainer ranks.

It reads top to bottom like ``gyre train``: paths resolved and the model's headers checked, every example
tokenised and masked (a bad row fails here, before Ray), the output directory claimed (``rundir``), then
Ray, the trainer ranks (``PolicyWorker``, DDP or FSDP2, the RL policy's own backend), the shared SFT loop
(``gyre.pipelines.sft.run_sft``), and the final model saved as ``gyre train`` saves it (the input's dtype,
the user's tokenizer files). Metrics go to ``metrics.jsonl`` (phase "sft") and TensorBoard.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gyre.config.derive import SFTPlan, detect_local_devices, make_sft_plan
from gyre.config.sft_schema import SFTJobConfig
from gyre.data.sft import SFTExample
from gyre.pipelines.interrupt import RunInterrupted, interruption_in
from gyre.pipelines.rundir import RunMode, begin, decide_start


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
    from gyre.cluster.faults import RoleFault, RunFailed
    from gyre.cluster.runtime import check_reachable, resolve_address, start_ray

    address = resolve_address(cfg, address, echo)
    cfg = resolve_sft_paths(cfg)
    if address:
        check_reachable(address)
    examples, pad_id = load_examples(cfg, echo)
    if address:
        plan = make_sft_plan(cfg, "cuda" if cfg.cluster.device == "cuda" else "cpu", None, len(examples))
    else:
        plan = make_sft_plan(cfg, *detect_local_devices(cfg), len(examples))
    start = decide_start(cfg.run.output_dir, mode)
    try:
        begin(start, cfg.run.name, echo)
        runtime = start_ray(cfg, plan.device_kind, plan.num_devices or 0, address, 0)
        try:
            if address:
                plan = make_sft_plan(cfg, runtime.device_kind, runtime.num_devices, len(examples))
            echo(plan.describe())
            return _run(cfg, plan, examples, pad_id)
        except RoleFault as fault:  # a trainer rank died, hung or raised: no checkpoint to recover from
            failed = RunFailed(fault, 0, 0, cfg.run.output_dir)
            failed.args = (f"{fault}. The SFT run stopped.",)
            raise failed from None
        finally:
            runtime.shutdown()
    except RunInterrupted as exc:
        exc.output_dir = cfg.run.output_dir
        raise
    except Exception as exc:  # noqa: BLE001 - a signal that landed inside native code: report it as one
        interrupted = interruption_in(exc)
        if interrupted is None:
            raise
        interrupted.output_dir = cfg.run.output_dir
        raise interrupted from None


def resolve_sft_paths(cfg: SFTJobConfig) -> SFTJobConfig:
    """A copy with the model resolved (Hub ids from the local cache, save_dtype concrete) and checked, and
    the data sources and output directory absolute."""
    from gyre.pipelines.preflight import absolute, absolute_source, check_policy_model, resolve_policy_model

    cfg = cfg.model_copy(deep=True)
    resolve_policy_model(cfg.model)
    check_policy_model(cfg.model)
    cfg.sft.train_files = [absolute_source(f) for f in cfg.sft.train_files]
    cfg.run.output_dir = Path(absolute(str(cfg.run.output_dir)))
    return cfg


def load_examples(cfg: SFTJobConfig, echo: Callable[[str], None]) -> tuple[list[SFTExample], int]:
    """Every example, tokenised and masked; and the pad id."""
    from gyre.data.prompts import PromptRenderer
    from gyre.data.sft import SFTColumns, load_sft_examples
    from gyre.models.loading import load_tokenizer

    m, sft = cfg.model, cfg.sft
    tokenizer = load_tokenizer(m.tokenizer_path or m.path, m.trust_remote_code)
    renderer = PromptRenderer(tokenizer, "auto", sft.system_prompt, sft.chat_template_kwargs, section="sft")
    examples, dropped = load_sft_examples(sft.train_files, renderer, int(tokenizer.eos_token_id), sft.max_tokens,
                                          SFTColumns.from_config(sft, "sft"), sft.overlong)
    trained = sum(sum(e.loss_mask) for e in examples)
    total = sum(len(e.input_ids) for e in examples)
    echo(f"data: {len(examples)} examples, {total} tokens of which {trained} trained ({trained / total:.0%})"
         + (f"; {dropped} dropped (longer than sft.max_tokens={sft.max_tokens})" if dropped else ""))
    return examples, int(tokenizer.pad_token_id)


def _run(cfg: SFTJobConfig, plan: SFTPlan, examples: list[SFTExample], pad_id: int) -> SFTSummary:
    from ray.util.placement_group import remove_placement_group

    from gyre.cluster.faults import Watchdog
    from gyre.cluster.group import RoleGroup
    from gyre.cluster.placement import create_placement
    from gyre.cluster.workers import PolicyWorker
    from gyre.config.report import resolved_yaml
    from gyre.pipelines.roles import connect_trainer, policy_trainer_spec
    from gyre.pipelines.sft import SFTTrainer, run_sft
    from gyre.tracking.logger import MetricsLogger, read_metrics
    from gyre.tracking.progress import Progress

    t0 = time.perf_counter()
    out, m = cfg.run.output_dir, cfg.model
    (out / "resolved_config.yaml").write_text(resolved_yaml(cfg))
    placement = create_placement(plan)
    policy = None
    logger = MetricsLogger(out, cfg.logging.tensorboard)
    progress = Progress(plan.steps, enabled=cfg.logging.progress, description="SFT")
    try:
        spec = policy_trainer_spec(m, cfg.policy.strategy, cfg.sft.micro_batch_size)
        policy = RoleGroup.create("policy", PolicyWorker, placement, lambda r: (
            (r, plan.dp_size, spec, plan.device_kind, plan.threads_per_worker, cfg.run.seed, None), {}))
        policy.watchdog = Watchdog.from_config(cfg.watchdog)
        connect_trainer(policy)
        run_sft(cfg.sft, examples, SFTTrainer(policy, plan.dp_size), pad_id, cfg.run.seed, logger, progress)
        final = out / "final_model"
        policy.call(PolicyWorker.save_hf, str(final), m.tokenizer_path or m.path, m.save_dtype)
    finally:
        progress.close()
        logger.close()
        if policy is not None:
            policy.kill()
        remove_placement_group(placement.group)
    losses = [r["sft_loss"] for r in read_metrics(out / "metrics.jsonl") if r.get("phase") == "sft"]
    return SFTSummary(plan.steps, len(examples), losses[0] if losses else None, losses[-1] if losses else None,
                      final, time.perf_counter() - t0)
