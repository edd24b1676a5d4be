"""Entry points behind ``gyre train`` and ``gyre check``: pre-flight, the run directory, Ray, roles,
the pipeline.

``train`` reads top to bottom: everything that can be checked without Ray is checked first
(``preflight.py``: config arithmetic, placement, model headers, reward functions on real rows, every
data row), then the output directory decides how the run starts (``rundir.py``: fresh, resume, or an
earlier run set aside), and only then does Ray start and ``run_pipeline`` build the roles and run.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from gyre.app.interrupt import RunInterrupted, interruption_in
from gyre.app.planning import Planning, plan_run, suggest_planning
from gyre.app.preflight import absolute, check_code_sandboxes, load_data, preflight, resolve_paths, with_memory
from gyre.app.rundir import RunMode, RunStart, begin, decide_start, read_hub_pins
from gyre.cluster.reward_pool import RewardWorkerError
from gyre.config.derive import RunPlan, make_plan
from gyre.config.report import format_plan, resolved_yaml
from gyre.config.schema import RLVRConfig
from gyre.models.hub import HubResolver
from gyre.rewards.checks import RewardProbe
from gyre.tracking.driver_log import DriverLog
from gyre.tracking.trackers import TrackerRun


def check(cfg: RLVRConfig, address: str | None = None, echo: Callable[[str], None] = print,
          planning: Planning | None = None) -> RunPlan:
    """What ``gyre check`` prints: the resolved config, the data, the reward probes and the placement
    plan. It starts no training; with an address it joins the cluster briefly to count its devices. A
    ``pipeline: sft`` or ``dpo`` config gets its own check (``standalone.check_standalone``). ``planning``
    (``--plan-only``): the plan for machines this one is not, checking what is here (``planning.py``)."""
    from gyre.cluster.runtime import resolve_address, start_ray

    if cfg.pipeline != "rlvr":
        if planning is not None:
            from gyre.config.load import ConfigError

            raise ConfigError(f"--plan-only plans RL runs (gyre train configs); a pipeline: {cfg.pipeline} config is "
                              "checked where its model and data are: drop --plan-only, --model-shape and --device")
        from gyre.app.standalone import check_standalone

        return check_standalone(cfg, echo)
    if planning is not None:
        return _plan_only(cfg, address, planning, echo)
    address = resolve_address(cfg, address, echo)
    with suggest_planning(cfg):
        cfg = resolve_paths(cfg)
        echo("# resolved configuration\n" + resolved_yaml(cfg))
        plan = preflight(cfg, address)
        data = _check_data(cfg, echo)
    if address:
        runtime = start_ray(cfg, plan.device_kind, 0, address)
        try:
            plan = with_memory(cfg, make_plan(cfg, runtime.device_kind, runtime.num_devices), local=False)
        finally:
            runtime.shutdown()
    echo(format_plan(cfg, _with_warmup(plan, cfg, data)))
    return plan


def _plan_only(cfg: RLVRConfig, address: str | None, planning: Planning, echo: Callable[[str], None]) -> RunPlan:
    """``gyre check --plan-only``: the plan for the devices the config names, and what was not checked here."""
    cfg, plan, missing = plan_run(cfg, planning, address, echo)
    data = _check_data(cfg, echo) if missing.reads_data else None
    echo(format_plan(cfg, _with_warmup(plan, cfg, data) if data is not None else plan))
    echo(missing.describe())
    return plan


def _check_data(cfg: RLVRConfig, echo: Callable[[str], None]):
    """Every data row (or the environment) loaded and checked, code sandboxes probed and the reward
    functions called on real rows."""
    with RewardProbe(cfg, echo) as probe:  # its processes import while the data loads
        data = load_data(cfg)
        if cfg.env is not None:
            echo(f"env: {cfg.env.id} built and reset once; {len(data.val_prompts)} validation seeds")
        else:
            echo(_describe_data(cfg, data))
        check_code_sandboxes(cfg, data.train + data.val_prompts, echo)
        probe.check(data.train)
    return data


def _describe_data(cfg: RLVRConfig, data) -> str:
    """The data line ``check`` and ``train`` print: prompt counts, and the over-long ones dropped or cut."""
    return (f"data: {len(data.train)} training prompts, {len(data.val_prompts)} held-out prompts"
            + data.overlong.describe(cfg.data.max_prompt_tokens)
            + (f"; SFT warm-up: {len(data.warmup.examples)} examples" if data.warmup else ""))


def _with_warmup(plan: RunPlan, cfg: RLVRConfig, data) -> RunPlan:
    """The plan with the SFT warm-up's steps, which sft_warmup.epochs derives from its loaded examples."""
    return plan.with_warmup(cfg.sft_warmup, len(data.warmup.examples)) if data.warmup else plan


def train(cfg: RLVRConfig, address: str | None = None, mode: RunMode = "fresh",
          echo: Callable[[str], None] = print):
    """Run a whole RLVR training job; returns its RunSummary. ``mode`` says what to do with a run
    already in ``run.output_dir`` (see ``rundir.RunMode``). What the driver prints, a line per step and
    the traceback of an error that ends the run are kept in ``driver.log`` in the run directory."""
    if cfg.pipeline != "rlvr":
        from gyre.config.load import ConfigError

        raise ConfigError(f"this is a pipeline: {cfg.pipeline} config; run it with gyre {cfg.pipeline} CONFIG "
                          "(gyre train runs RL configs)")
    log = DriverLog(echo)
    try:
        return _train(cfg, address, mode, log)
    except BaseException as exc:
        log.error(exc)
        raise
    finally:
        log.close()


def _train(cfg: RLVRConfig, address: str | None, mode: RunMode, log: DriverLog):
    from gyre.cluster.runtime import resolve_address, start_ray

    echo = log.echo
    address = resolve_address(cfg, address, echo)
    # How the run starts decides how Hub ids resolve: a resumed run keeps the snapshots it started from.
    start = decide_start(Path(absolute(str(cfg.run.output_dir))), mode)
    hub = HubResolver(read_hub_pins(start.output_dir) if start.checkpoint else None, echo)
    cfg = resolve_paths(cfg, hub)
    plan = preflight(cfg, address)
    with RewardProbe(cfg, echo) as probe:  # its processes import while the data loads
        data = load_data(cfg)
        if cfg.data is not None:
            echo(_describe_data(cfg, data))
        check_code_sandboxes(cfg, data.train + data.val_prompts, echo)
        probe.check(data.train)
    try:
        start = begin(start, cfg.run.name, echo, hub.resolved)
        log.attach(start.output_dir, resumed=start.checkpoint is not None)
        runtime = start_ray(cfg, plan.device_kind, plan.num_devices or 0, address, plan.reward_workers)
        try:
            if address:
                plan = make_plan(cfg, runtime.device_kind, runtime.num_devices)
            plan = _with_warmup(plan, cfg, data)
            echo(format_plan(cfg, plan))
            echo(TrackerRun.from_config(cfg.logging, cfg.run.name, start.run_id).describe(start.output_dir))
            return run_with_recovery(cfg, plan, data, start, echo)
        finally:
            runtime.shutdown()
    except (RunInterrupted, RewardWorkerError) as exc:
        exc.output_dir = Path(cfg.run.output_dir)  # the CLI names its last checkpoint and the resume command
        raise
    except Exception as exc:  # noqa: BLE001 - a signal that landed inside native code: report it as one
        interrupted = interruption_in(exc)
        if interrupted is None:
            raise
        interrupted.output_dir = Path(cfg.run.output_dir)
        raise interrupted from None


def run_with_recovery(cfg: RLVRConfig, plan: RunPlan, data, start: RunStart, echo):
    """``run_pipeline``, and after each recoverable fault (a worker died or hung) the same again with new
    workers from the run's latest checkpoint, at most ``run.max_restarts`` times. Resume is exact, so the
    metric stream goes on as if nothing had happened; the steps after the checkpoint run again."""
    from gyre.cluster.faults import RoleFault, RunFailed, Watchdog
    from gyre.training.checkpoint import CheckpointManager

    watchdog = Watchdog.from_config(cfg.watchdog)  # usual call durations survive the rebuilds
    first_data = data.train_sampler.state_dict()  # where a restart from scratch must begin the data again
    recoveries = 0
    while True:
        try:
            return run_pipeline(cfg, plan, data, start, echo, watchdog, recoveries)
        except RoleFault as fault:
            if not fault.recoverable or recoveries >= cfg.run.max_restarts:
                raise RunFailed(fault, recoveries, cfg.run.max_restarts, Path(cfg.run.output_dir)) from None
            recoveries += 1
            latest = CheckpointManager(cfg.run.output_dir).latest()
            echo(f"gyre: {fault}. Recovering ({recoveries} of at most {cfg.run.max_restarts}): new workers, "
                 f"continuing from {latest or 'the start'}.")
            start = replace(start, checkpoint=latest)
            if latest is None:
                data.train_sampler.load_state_dict(first_data)


def run_pipeline(cfg: RLVRConfig, plan: RunPlan, data, start: RunStart, echo, watchdog=None, recoveries: int = 0):
    """Build the roles and run the pipeline from ``start``: from scratch, or from a checkpoint of this run.
    ``recoveries`` > 0: the run restarts after a fault (with no checkpoint, its own records are dropped)."""
    from gyre.cluster.roles import build_roles
    from gyre.pipelines.rlvr import RLVRPipeline
    from gyre.tracking.generations import drop_generations_after
    from gyre.tracking.logger import MetricsLogger
    from gyre.tracking.plot import plot_run
    from gyre.tracking.report import refresh_report
    from gyre.tracking.run_info import write_run_info
    from gyre.tracking.timeline import Timeline
    from gyre.training.checkpoint import CheckpointManager

    out = Path(cfg.run.output_dir)
    (out / "resolved_config.yaml").write_text(resolved_yaml(cfg))
    write_run_info(out, format_plan(cfg, plan))
    checkpoints = CheckpointManager(out, cfg.checkpoint.keep_last, start.run_id)
    latest = start.checkpoint
    resume_step = checkpoints.load_state(latest).step if latest else None
    restart = recoveries > 0 and latest is None
    if resume_step is not None or restart:
        drop_generations_after(out / "generations", resume_step)
    # The trackers open before any model loads: a missing login or a server out of reach is found at once.
    logger = MetricsLogger(out, TrackerRun.from_config(cfg.logging, cfg.run.name, start.run_id), resume_step,
                           restart=restart, config=cfg.model_dump(mode="json"))
    roles = None
    try:
        roles = build_roles(cfg, plan, watchdog)
        if roles.placement.nodes > 1 or plan.device_kind == "cuda":  # which node and GPUs hold each device
            echo(roles.placement.describe())
        timeline = Timeline(out, resume_step=resume_step, restart=restart)
        if cfg.sft_warmup is not None and latest is None:
            _sft_warmup(cfg, plan, roles, data, logger)
        _configure_optimizers(cfg, plan, roles)
        pipeline = RLVRPipeline(cfg, plan, roles, data, logger, checkpoints, timeline)
        pipeline.recoveries = recoveries
        summary = pipeline.run(resume_from=latest, echo=echo)
        if cfg.logging.plot:
            plot_run(out / "metrics.jsonl", out / "metrics.png", title=cfg.run.name)
        if cfg.logging.report:
            refresh_report(out, echo)
        return summary
    finally:
        logger.close()  # never raises: a tracker that fails to close is warned about
        if roles is not None:
            roles.kill()
        sys.stdout.flush()


def _configure_optimizers(cfg: RLVRConfig, plan: RunPlan, roles) -> None:
    """The policy's and critics' AdamW and LR schedule over the run's optimizer steps."""
    from gyre.cluster.workers import CriticWorker, PolicyWorker

    p, c, steps = cfg.policy, cfg.critic, plan.total_optimizer_steps
    roles.policy.call(PolicyWorker.configure_optimizer, p.optimizer.spec(), p.scheduler.spec(), steps, p.grad_clip)
    for critic in roles.critics:
        critic.call(CriticWorker.configure_optimizer, c.optimizer.spec(), c.scheduler.spec(), steps, c.grad_clip)


def _sft_warmup(cfg: RLVRConfig, plan: RunPlan, roles, data, logger) -> None:
    from gyre.pipelines.sft import SFTTrainer, run_sft
    from gyre.tracking.progress import Progress

    trainer = SFTTrainer(roles.policy, plan.dp_size, lambda: roles.timeshare.activate("policy"))
    progress = Progress(data.warmup.steps, enabled=cfg.logging.progress, description="SFT warm-up")
    try:
        run_sft(cfg.sft_warmup, data.warmup.examples, trainer, data.pad_id, cfg.run.seed, logger, progress)
    finally:
        progress.close()


def warm_up(cfg: RLVRConfig, target: Path, echo: Callable[[str], None] = print) -> Path:
    """Run only ``cfg.sft_warmup`` and save the model in Hugging Face format at ``target`` (a shared
    starting point for ablations)."""
    from gyre.cluster.roles import build_roles
    from gyre.cluster.runtime import start_ray
    from gyre.cluster.workers import PolicyWorker
    from gyre.tracking.logger import MetricsLogger

    cfg = resolve_paths(cfg)
    plan = preflight(cfg, None)
    data = load_data(cfg)
    runtime = start_ray(cfg, plan.device_kind, plan.num_devices or 0, None, plan.reward_workers)
    try:
        roles = build_roles(cfg, plan)
        logger = MetricsLogger(target.parent / "warm_start_logs")
        try:
            echo(f"SFT warm-up ({data.warmup.steps} steps), shared by every run")
            _sft_warmup(cfg, plan, roles, data, logger)
            # float32: the variants continue training from it, so nothing is rounded away in between.
            roles.policy.call(PolicyWorker.save_hf, str(target), cfg.model.tokenizer_path or cfg.model.path,
                              "float32")
        finally:
            logger.close()
            roles.kill()
    finally:
        runtime.shutdown()
    return target
