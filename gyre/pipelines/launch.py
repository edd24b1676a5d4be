"""Entry points behind ``gyre train`` and ``gyre check``: pre-flight, Ray, roles, the pipeline.

Everything that can be checked without Ray is checked first (config arithmetic, placement, model
directory, every data row, the reward function), so bad input fails in seconds with a clear message.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from gyre.config.derive import RunPlan, detect_local_devices, make_plan
from gyre.config.report import format_plan, resolved_yaml
from gyre.config.schema import RLVRConfig
from gyre.models.loading import check_model_dir
from gyre.rewards.base import BUILTIN, load_function


def preflight(cfg: RLVRConfig, address: str | None) -> RunPlan | None:
    """Validate the config and inputs; returns the plan (None when devices are only known after joining)."""
    check_model_dir(cfg.model.path)
    if cfg.model.tokenizer_path:
        check_model_dir(cfg.model.tokenizer_path, key="model.tokenizer_path")
    load_function(cfg.reward.function if cfg.reward.type == "function" else BUILTIN[cfg.reward.type])
    if address:
        return None
    kind, count = detect_local_devices(cfg)
    return make_plan(cfg, kind, count)


def check(cfg: RLVRConfig, address: str | None = None, echo: Callable[[str], None] = print) -> RunPlan | None:
    """What ``gyre check`` prints: the resolved config and the placement plan; starts nothing."""
    from gyre.cluster.runtime import resolve_address
    from gyre.pipelines.rlvr_data import RunData

    address = resolve_address(cfg, address)
    echo("# resolved configuration\n" + resolved_yaml(cfg))
    plan = preflight(cfg, address)
    data = RunData.load(cfg)
    echo(f"data: {len(data.train)} training prompts, {len(data.val_prompts)} held-out prompts"
         + (f" ({data.dropped_long} dropped: longer than data.max_prompt_tokens)" if data.dropped_long else ""))
    if plan is None:
        echo(f"placement: devices are counted when joining the Ray cluster at {address}")
    else:
        echo(format_plan(cfg, plan))
    return plan


def train(cfg: RLVRConfig, address: str | None = None, resume: bool = False, echo: Callable[[str], None] = print):
    """Run a whole RLVR training job; returns its RunSummary."""
    from gyre.cluster.runtime import resolve_address, start_ray
    from gyre.pipelines.rlvr_data import RunData

    address = resolve_address(cfg, address)
    plan = preflight(cfg, address)
    data = RunData.load(cfg)
    if plan is not None:
        runtime = start_ray(cfg, plan.device_kind, plan.num_devices, None)
    else:
        runtime = start_ray(cfg, "cpu", 0, address)
        plan = make_plan(cfg, runtime.device_kind, runtime.num_devices)
    echo(format_plan(cfg, plan))
    try:
        return _run(cfg, plan, data, resume, echo)
    finally:
        if runtime.started_here:
            runtime.shutdown()


def _run(cfg: RLVRConfig, plan: RunPlan, data, resume: bool, echo):
    from gyre.pipelines.checkpoint import CheckpointManager
    from gyre.pipelines.rlvr import RLVRPipeline
    from gyre.pipelines.rlvr_data import config_fingerprint
    from gyre.pipelines.roles import build_roles
    from gyre.pipelines.sft import run_sft
    from gyre.tracking.logger import MetricsLogger
    from gyre.tracking.plot import plot_run
    from gyre.tracking.progress import Progress

    out = Path(cfg.run.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(resolved_yaml(cfg))
    ckpts = CheckpointManager(out, cfg.checkpoint.keep_last)
    latest = ckpts.latest() if resume else None
    if resume:
        ckpts.clean_partial()
        echo(f"resuming from {latest}" if latest else "no checkpoint found: starting from scratch")
    roles = build_roles(cfg, plan)
    logger = None
    try:
        start = ckpts.load_state(latest).step if latest else 0
        if latest and ckpts.load_state(latest).config_hash != config_fingerprint(cfg):
            echo("warning: the config differs from the checkpointed run's (beyond run.steps and logging)")
        logger = MetricsLogger(out, cfg.logging.tensorboard, resume_step=start if latest else None)
        if cfg.sft_warmup is not None and not latest:
            progress = Progress(cfg.sft_warmup.steps, enabled=cfg.logging.progress, description="SFT warm-up")
            try:
                run_sft(cfg.sft_warmup, plan, roles, data.renderer, data.pad_id, int(data.tokenizer.eos_token_id),
                        cfg.run.seed, logger, progress)
            finally:
                progress.close()
        p = cfg.policy
        roles.policy.call("configure_optimizer", p.optimizer, p.scheduler, plan.total_optimizer_steps, p.grad_clip)
        progress = Progress(cfg.run.steps, start=start, enabled=cfg.logging.progress, description="GRPO")
        pipeline = RLVRPipeline(cfg, plan, roles, data, logger, progress)
        try:
            if latest:
                pipeline.restore(latest)
            else:
                pipeline.sync_weights(0)
            summary = pipeline.run(start)
        finally:
            progress.close()
        if cfg.logging.plot:
            plot_run(out / "metrics.jsonl", out / "reward_accuracy.png", title=cfg.run.name)
        return summary
    finally:
        if logger is not None:
            logger.close()
        roles.kill()
        sys.stdout.flush()
