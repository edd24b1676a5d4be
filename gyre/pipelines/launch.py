"""Entry points behind ``gyre train`` and ``gyre check``: pre-flight, Ray, roles, the pipeline.

Everything that can be checked without Ray is checked first (config arithmetic, placement, model
directory, every data row and ground truth, the reward function), so bad input fails in seconds with
a clear message.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from gyre.config.derive import RunPlan, detect_local_devices, make_plan
from gyre.config.report import format_plan, resolved_yaml
from gyre.config.schema import RLVRConfig
from gyre.models.loading import check_model_dir
from gyre.rewards.registry import check_functions


def resolve_paths(cfg: RLVRConfig) -> RLVRConfig:
    """A copy with every path absolute: actors may run in another directory or on another node."""

    def absolute(path: str) -> str:
        return str(Path(path).expanduser().resolve())

    cfg = cfg.model_copy(deep=True)
    cfg.model.path = absolute(cfg.model.path)
    if cfg.model.tokenizer_path:
        cfg.model.tokenizer_path = absolute(cfg.model.tokenizer_path)
    cfg.data.train_files = [absolute(f) for f in cfg.data.train_files]
    cfg.data.val_files = [absolute(f) for f in cfg.data.val_files]
    cfg.run.output_dir = Path(absolute(str(cfg.run.output_dir)))
    if cfg.sft_warmup is not None:
        cfg.sft_warmup.train_files = [absolute(f) for f in cfg.sft_warmup.train_files]
    for domain in cfg.reward.domains.values():
        fn = domain.function
        if fn and fn.rpartition(":")[0].endswith(".py"):
            target, _, name = fn.rpartition(":")
            domain.function = f"{absolute(target)}:{name}"
        if domain.judge is not None and domain.judge.model_path:
            domain.judge.model_path = absolute(domain.judge.model_path)
        if domain.reward_model is not None:
            domain.reward_model.path = absolute(domain.reward_model.path)
    return cfg


def preflight(cfg: RLVRConfig, address: str | None) -> RunPlan:
    """Validate the config and inputs without Ray. With an ``address`` the devices are counted only
    after joining, so the plan checks everything but whether the named devices exist."""
    check_model_dir(cfg.model.path)
    if cfg.model.tokenizer_path:
        check_model_dir(cfg.model.tokenizer_path, key="model.tokenizer_path")
    for name, domain in cfg.reward.domains.items():
        check_functions(domain)
        if domain.model_role == "judge":
            check_model_dir(domain.judge.model_path, key=f"reward.domains.{name}.judge.model_path")
        if domain.reward_model is not None:
            check_model_dir(domain.reward_model.path, key=f"reward.domains.{name}.reward_model.path")
    if address:
        return make_plan(cfg, "cuda" if cfg.cluster.device == "cuda" else "cpu", None)
    kind, count = detect_local_devices(cfg)
    return make_plan(cfg, kind, count)


def load_data(cfg: RLVRConfig):
    """Every prompt row, tokenised, routed to its reward domain and validated (each domain checks its
    ground truths: math answers, code tests, constraint lists...)."""
    from gyre.data.prompts import DataError
    from gyre.pipelines.rlvr_data import RunData
    from gyre.rewards.registry import bad_ground_truths

    data = RunData.load(cfg)
    for name, domain in cfg.reward.domains.items():
        records = [r for r in data.train + data.val_prompts if r.domain == name]
        bad = bad_ground_truths(domain, records)
        if bad:
            raise DataError(f"{len(bad)} ground truths of reward domain {name!r} ({domain.type}) cannot be used, "
                            "e.g. " + "; ".join(f"{r.uid}: {r.ground_truth[:80]!r} ({why})" for r, why in bad[:3]))
    return data


def check(cfg: RLVRConfig, address: str | None = None, echo: Callable[[str], None] = print) -> RunPlan:
    """What ``gyre check`` prints: the resolved config and the placement plan. It starts no training;
    with an address it joins the cluster briefly to count its devices."""
    from gyre.cluster.runtime import resolve_address, start_ray

    address = resolve_address(cfg, address)
    cfg = resolve_paths(cfg)
    echo("# resolved configuration\n" + resolved_yaml(cfg))
    plan = preflight(cfg, address)
    data = load_data(cfg)
    echo(f"data: {len(data.train)} training prompts, {len(data.val_prompts)} held-out prompts"
         + (f" ({data.dropped_long} dropped: longer than data.max_prompt_tokens)" if data.dropped_long else ""))
    if address:
        runtime = start_ray(cfg, plan.device_kind, 0, address)
        try:
            plan = make_plan(cfg, runtime.device_kind, runtime.num_devices)
        finally:
            runtime.shutdown()
    echo(format_plan(cfg, plan))
    return plan


def train(cfg: RLVRConfig, address: str | None = None, resume: bool = False, echo: Callable[[str], None] = print):
    """Run a whole RLVR training job; returns its RunSummary."""
    from gyre.cluster.runtime import resolve_address, start_ray

    address = resolve_address(cfg, address)
    cfg = resolve_paths(cfg)
    plan = preflight(cfg, address)
    data = load_data(cfg)
    runtime = start_ray(cfg, plan.device_kind, plan.num_devices or 0, address, plan.reward_workers)
    try:
        if address:
            plan = make_plan(cfg, runtime.device_kind, runtime.num_devices)
        echo(format_plan(cfg, plan))
        return _run(cfg, plan, data, resume, echo)
    finally:
        runtime.shutdown()


def _run(cfg: RLVRConfig, plan: RunPlan, data, resume: bool, echo):
    from gyre.pipelines.checkpoint import CheckpointManager
    from gyre.pipelines.rlvr import RLVRPipeline
    from gyre.pipelines.roles import build_roles
    from gyre.tracking.logger import MetricsLogger
    from gyre.tracking.plot import plot_run

    out = Path(cfg.run.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(resolved_yaml(cfg))
    checkpoints = CheckpointManager(out, cfg.checkpoint.keep_last)
    latest = checkpoints.find_resume_point(resume, echo)
    roles = build_roles(cfg, plan)
    logger = None
    try:
        start = checkpoints.load_state(latest).step if latest else None
        logger = MetricsLogger(out, cfg.logging.tensorboard, resume_step=start)
        if cfg.sft_warmup is not None and latest is None:
            _sft_warmup(cfg, plan, roles, data, logger)
        p = cfg.policy
        roles.policy.call("configure_optimizer", p.optimizer, p.scheduler, plan.total_optimizer_steps, p.grad_clip)
        if roles.critic is not None:
            c = cfg.critic
            roles.critic.call("configure_optimizer", c.optimizer, c.scheduler, plan.total_optimizer_steps, c.grad_clip)
        pipeline = RLVRPipeline(cfg, plan, roles, data, logger, checkpoints)
        summary = pipeline.run(resume_from=latest, echo=echo)
        if cfg.logging.plot:
            plot_run(out / "metrics.jsonl", out / "reward_accuracy.png", title=cfg.run.name)
        return summary
    finally:
        if logger is not None:
            logger.close()
        roles.kill()
        sys.stdout.flush()


def _sft_warmup(cfg: RLVRConfig, plan: RunPlan, roles, data, logger) -> None:
    from gyre.pipelines.sft import run_sft
    from gyre.tracking.progress import Progress

    progress = Progress(cfg.sft_warmup.steps, enabled=cfg.logging.progress, description="SFT warm-up")
    try:
        run_sft(cfg.sft_warmup, plan, roles, data.renderer, data.pad_id, int(data.tokenizer.eos_token_id),
                cfg.run.seed, logger, progress)
    finally:
        progress.close()


def warm_up(cfg: RLVRConfig, target: Path, echo: Callable[[str], None] = print) -> Path:
    """Run only ``cfg.sft_warmup`` and save the model in Hugging Face format at ``target`` (a shared
    starting point for ablations)."""
    from gyre.cluster.runtime import start_ray
    from gyre.pipelines.roles import build_roles
    from gyre.tracking.logger import MetricsLogger

    cfg = resolve_paths(cfg)
    plan = preflight(cfg, None)
    data = load_data(cfg)
    runtime = start_ray(cfg, plan.device_kind, plan.num_devices or 0, None, plan.reward_workers)
    try:
        roles = build_roles(cfg, plan)
        logger = MetricsLogger(target.parent / "warm_start_logs", False)
        try:
            echo(f"SFT warm-up ({cfg.sft_warmup.steps} steps), shared by every run")
            _sft_warmup(cfg, plan, roles, data, logger)
            roles.policy.call("save_hf", str(target), cfg.model.tokenizer_path or cfg.model.path)
        finally:
            logger.close()
            roles.kill()
    finally:
        runtime.shutdown()
    return target
