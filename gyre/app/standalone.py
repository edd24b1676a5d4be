"""The frame shared by the standalone trainer runs, ``gyre sft`` and ``gyre dpo``.

``standalone_run`` reads top to bottom: the data loaded and tokenised (a bad row fails here, before Ray), the
plan (devices checked, the length in steps), the output directory claimed (``rundir``), then Ray and the
run's own body; a trainer rank that dies, hangs or raises ends the run with a message naming it (these runs
keep no checkpoints to resume from), and a signal ends it cleanly. ``trainer_session`` gives the body its placement
group, metrics logger and progress line, the policy trainer ranks (DDP or FSDP2, LoRA when configured: the
RL policy's own backend) and the final save, and releases them all at the end.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gyre.app.interrupt import RunInterrupted, interruption_in
from gyre.app.rundir import RunMode, begin, decide_start, read_run_id


def standalone_run(cfg, address: str | None, mode: RunMode, echo: Callable[[str], None], make_plan: Callable,
                   load: Callable, body: Callable, what: str):
    """Run ``body(cfg, plan, data, echo)`` in a fresh Ray with ``data = load(cfg, echo)``, a tuple whose first
    item is the list of examples (or pairs); ``make_plan(cfg, kind, devices, examples)`` is the run's plan
    (``gyre.config.derive``: its length may count epochs over the examples); ``what`` names the run in
    messages ("SFT")."""
    from gyre.tracking.driver_log import DriverLog

    log = DriverLog(echo)  # driver.log: what is printed, a line per step, a fatal error's traceback
    try:
        return _standalone_run(cfg, address, mode, log, make_plan, load, body, what)
    except BaseException as exc:
        log.error(exc)
        raise
    finally:
        log.close()


def _standalone_run(cfg, address: str | None, mode: RunMode, log, make_plan: Callable, load: Callable,
                    body: Callable, what: str):
    from gyre.cluster.faults import RoleFault, RunFailed
    from gyre.cluster.runtime import check_reachable, resolve_address, start_ray
    from gyre.config.derive import detect_local_devices
    from gyre.tracking.report import refresh_report

    echo = log.echo
    address = resolve_address(cfg, address, echo)
    if address:
        check_reachable(address)
    data = load(cfg, echo)
    items = len(data[0])
    if address:
        plan = make_plan(cfg, "cuda" if cfg.cluster.device == "cuda" else "cpu", None, items)
    else:
        plan = make_plan(cfg, *detect_local_devices(cfg), items)
    start = decide_start(cfg.run.output_dir, mode)
    try:
        begin(start, cfg.run.name, echo)
        log.attach(cfg.run.output_dir, resumed=False)
        runtime = start_ray(cfg, plan.device_kind, plan.num_devices or 0, address, 0)
        try:
            if address:
                plan = make_plan(cfg, runtime.device_kind, runtime.num_devices, items)
            echo(plan.describe())
            result = body(cfg, plan, data, echo)
            if cfg.logging.report:
                refresh_report(cfg.run.output_dir, echo)
            return result
        except RoleFault as fault:  # a rank died, hung or raised: no checkpoint to recover from
            failed = RunFailed(fault, 0, 0, cfg.run.output_dir)
            failed.args = (f"{fault}. The {what} run stopped.",)
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


def check_standalone(cfg, echo: Callable[[str], None] = print):
    """``gyre check`` of a ``pipeline: sft`` or ``dpo`` config: the resolved config, every example (or pair)
    tokenised and masked as the run would, and the plan on this machine's devices; nothing starts."""
    from gyre.config.derive import detect_local_devices
    from gyre.config.report import resolved_yaml

    section = cfg.pipeline
    if section == "sft":
        from gyre.app.sft_run import load_examples as load
        from gyre.config.derive import make_sft_plan as make_plan
    else:
        from gyre.app.dpo_run import load_pairs as load
        from gyre.config.derive import make_dpo_plan as make_plan
    cfg = resolve_paths(cfg, section)
    echo("# resolved configuration\n" + resolved_yaml(cfg))
    data = load(cfg, echo)
    plan = make_plan(cfg, *detect_local_devices(cfg), len(data[0]))
    echo(plan.describe())
    return plan


def resolve_paths(cfg, section: str):
    """A copy of ``cfg`` with the model resolved (Hub ids from the local cache, save_dtype concrete) and
    checked, and the data sources of ``cfg.<section>.train_files`` and the output directory absolute."""
    from gyre.app.preflight import absolute, absolute_source, check_policy_model, resolve_policy_model

    cfg = cfg.model_copy(deep=True)
    resolve_policy_model(cfg.model, cluster=cfg.cluster)
    check_policy_model(cfg.model)
    data = getattr(cfg, section)
    data.train_files = [absolute_source(f) for f in data.train_files]
    cfg.run.output_dir = Path(absolute(str(cfg.run.output_dir)))
    return cfg


def renderer_for(cfg, section: str):
    """The PromptRenderer of ``cfg.<section>``'s rows: the model's tokenizer (``renderer.tokenizer``), its chat
    template, the section's system prompt and template arguments."""
    from gyre.data.prompts import PromptRenderer
    from gyre.models.loading import load_tokenizer

    m, data = cfg.model, getattr(cfg, section)
    tokenizer = load_tokenizer(m.tokenizer_path or m.path, m.trust_remote_code)
    return PromptRenderer(tokenizer, "auto", data.system_prompt, data.chat_template_kwargs, section=section)


@dataclass
class TrainerSession:
    """What a standalone run's body holds while it runs (``trainer_session``)."""

    cfg: Any
    """The run's config (SFTJobConfig or DPOJobConfig)."""
    plan: Any
    """Its SFTPlan."""
    placement: Any
    logger: Any
    """The MetricsLogger of run.output_dir."""
    progress: Any
    groups: list = field(default_factory=list)
    """Every role group started, killed at the end."""

    def start(self, role: str, worker_cls: type, args_for_rank: Callable[[int], tuple]):
        """A role's actors on its devices, with the run's deadlines on every call."""
        from gyre.cluster.faults import Watchdog
        from gyre.cluster.group import RoleGroup

        group = RoleGroup.create(role, worker_cls, self.placement, lambda r: (args_for_rank(r), {}))
        group.watchdog = Watchdog.from_config(self.cfg.watchdog)
        self.groups.append(group)
        return group

    def start_policy(self, micro_batch_size: int):
        """The policy trainer ranks, joined in their process group and holding the model."""
        from gyre.cluster.roles import connect_trainer, policy_trainer_spec
        from gyre.cluster.workers import PolicyWorker

        cfg, plan = self.cfg, self.plan
        spec = policy_trainer_spec(cfg.model, cfg.policy.strategy, micro_batch_size, cfg.policy.lora, cfg.run.seed,
                                   cfg.policy.levers)
        policy = self.start("policy", PolicyWorker, lambda r: (
            r, plan.dp_size, spec, plan.device_kind, plan.threads_per_worker, cfg.run.seed, None))
        connect_trainer(policy)
        return policy

    def save_final(self, policy) -> Path:
        """final_model/ (with LoRA: merged) and, with LoRA, final_adapter/ as policy.lora.save asks; returns
        the model directory, or the adapter's when only that is written."""
        from gyre.cluster.workers import PolicyWorker

        m, lora = self.cfg.model, self.cfg.policy.lora
        out = self.cfg.run.output_dir / "final_model"
        merged = out if lora is None or lora.save != "adapter" else None
        adapter = out.with_name("final_adapter") if lora is not None and lora.save != "merged" else None
        policy.call(PolicyWorker.save_hf, merged and str(merged), m.tokenizer_path or m.path, m.save_dtype,
                    adapter and str(adapter))
        return merged or adapter


@contextlib.contextmanager
def trainer_session(cfg, plan, description: str) -> Iterator[TrainerSession]:
    """resolved_config.yaml written; the placement group, metrics logger and progress line (``plan.steps``
    long) for the body; every role killed and all of it released at the end."""
    from ray.util.placement_group import remove_placement_group

    from gyre.cluster.placement import create_placement
    from gyre.config.report import resolved_yaml
    from gyre.tracking.logger import MetricsLogger
    from gyre.tracking.progress import Progress
    from gyre.tracking.trackers import TrackerRun

    out = cfg.run.output_dir
    (out / "resolved_config.yaml").write_text(resolved_yaml(cfg))
    placement = create_placement(plan)
    trackers = TrackerRun.from_config(cfg.logging, cfg.run.name, read_run_id(out))
    logger = MetricsLogger(out, trackers, config=cfg.model_dump(mode="json"))
    progress = Progress(plan.steps, enabled=cfg.logging.progress, description=description)
    session = TrainerSession(cfg, plan, placement, logger, progress)
    try:
        yield session
    finally:
        progress.close()
        logger.close()
        for group in session.groups:
            group.kill()
        remove_placement_group(placement.group)


def first_and_last(output_dir: Path, phase: str, key: str) -> tuple[float | None, float | None]:
    """The first and last value of metric ``key`` in the run's metrics.jsonl (phase ``phase``)."""
    from gyre.tracking.logger import read_metrics

    values = [r[key] for r in read_metrics(output_dir / "metrics.jsonl") if r.get("phase") == phase and key in r]
    return (values[0], values[-1]) if values else (None, None)
