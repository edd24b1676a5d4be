"""Command line: ``gyre train | check | config | sft | dpo | eval | generate | export | init-model | init-data |
quickstart | ablate | report | sandbox-serve``. Each command parses its flags here and calls one function of
``gyre.app`` (the job runners, which drive the controllers of ``gyre.pipelines``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="run config (YAML)")
    p.add_argument("overrides", nargs="*", help="key.path=value overrides, e.g. policy.optimizer.lr=1e-5")
    p.add_argument("--address", default=None,
                   help="Ray cluster to join (auto, host:6379, ray://host:10001); default: a private local Ray "
                        "($RAY_ADDRESS is not used: pass --address $RAY_ADDRESS to join it)")


def _add_check(sub) -> None:
    """gyre check, and its planning mode: a run's plan for machines this one is not (a cluster, from a laptop)."""
    p = sub.add_parser("check", help="print the resolved config, placement plan and memory estimate; start nothing")
    _add_config_args(p)
    p.add_argument("--plan-only", action="store_true",
                   help="plan the run for the devices the config names without their machines: placement, engines "
                        "and each role's memory per device; what this machine lacks (model directories, data "
                        "files) is listed as not checked instead of failing. Joins no cluster")
    p.add_argument("--model-shape", default=None, metavar="SIZE|CONFIG_JSON",
                   help="the model's shape for the memory estimate: a catalog size (0.5b, 1.5b, 3b, 7b, 8b, 14b, "
                        "32b) or a model's config.json (default: the model directory when it is here, else the size "
                        "its name states, announced as a guess); implies --plan-only")
    p.add_argument("--device", default=None, metavar="CLASS|GB",
                   help="one GPU's memory for the fit verdict: a device class (h100, h800, h200, h20, a100, l40s) or "
                        "GB, e.g. 80 (default: cluster.device_memory_gb; neither: the estimate without a verdict); "
                        "implies --plan-only")


def planning_of(args: argparse.Namespace):
    """The Planning (gyre.app.planning) gyre check's flags ask for; None: an ordinary check."""
    if not (args.plan_only or args.model_shape or args.device):
        return None
    from gyre.app.planning import Planning

    return Planning(args.model_shape, args.device)


def _resume_value(text: str) -> str:
    if text != "auto":
        raise argparse.ArgumentTypeError(f"takes no value or 'auto', not {text!r} (put key=value overrides before "
                                         "--resume)")
    return text


def _add_start_args(p: argparse.ArgumentParser, what: str = "run.output_dir") -> None:
    """--resume [auto] | --overwrite: what to do with a run already in the output directory."""
    group = p.add_mutually_exclusive_group()
    group.add_argument("--resume", nargs="?", const=True, default=None, type=_resume_value, metavar="auto",
                       help=f"continue from the latest checkpoint in {what} (one must exist); --resume auto: "
                            "resume when there is one, else start fresh")
    group.add_argument("--overwrite", action="store_true",
                       help=f"move a run already in {what} aside to <dir>.old-<time> (nothing is deleted) and "
                            "start fresh")


def run_mode(args: argparse.Namespace) -> str:
    """The RunMode (gyre.app.rundir) the start flags ask for."""
    if args.overwrite:
        return "overwrite"
    return {None: "fresh", True: "resume", "auto": "auto"}[args.resume]


def version() -> str:
    """The installed package's version (its metadata), else the source tree's."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("gyre")
    except PackageNotFoundError:
        from gyre import __version__

        return __version__


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL",
                   help="a Hugging Face model directory, a Hub id in the local cache, a run's output directory (its "
                        "final model, else its latest checkpoint) or a checkpoint (RUN/checkpoints/step_N)")
    p.add_argument("--step", type=int, default=None, help="checkpoint N of the run MODEL names")
    p.add_argument("--revision", default=None, help="the cached revision of a Hub id (default main)")


def _add_prompt_args(p: argparse.ArgumentParser, data_help: str) -> None:
    """What eval and generate share: a run config's sections, overrides, the prompts and sampling."""
    _add_model_args(p)
    p.add_argument("overrides", nargs="*", help="key.path=value overrides of the config, e.g. data.prompt_key=question")
    p.add_argument("--config", default=None, help="a gyre train config whose model/data/reward/validation/rollout "
                                                  "sections apply (default: the run's own config, for a run)")
    p.add_argument("--data", action="append", default=None, metavar="SOURCE", help=data_help + " (repeat for several)")
    p.add_argument("--n", type=int, default=None, help="samples per prompt")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--seed", type=int, default=None, help="seeds the sampling streams (run.seed)")
    p.add_argument("--out", default=None)
    p.add_argument("--overwrite", action="store_true", help="replace output files that exist")


def _add_commands(sub) -> None:
    """sft, dpo, eval, generate and export."""
    for name, text in (("sft", "supervised fine-tuning (chat or prompt/response data) on the policy trainer"),
                       ("dpo", "preference optimisation (DPO, IPO, SimPO, ...) on chosen/rejected pairs")):
        p = sub.add_parser(name, help=text)
        _add_config_args(p)
        p.add_argument("--overwrite", action="store_true",
                       help="move a run already in run.output_dir aside to <dir>.old-<time> (nothing is deleted)")

    p = sub.add_parser("eval", help="accuracy, pass@k and mean@k of a model or checkpoint on held-out prompts")
    _add_prompt_args(p, "held-out prompt files, directories or globs (data.val_files)")
    p.add_argument("--k", default=None, help="the k of pass@k, e.g. 1,4,8 (default 1, 2, 4, ... and n)")
    p.add_argument("--max-prompts", type=int, default=None, help="the first N prompts only (data.max_val_prompts)")

    p = sub.add_parser("generate", help="batch inference: responses to a prompt file, written as JSONL")
    _add_prompt_args(p, "prompt files, directories or globs (read like data.train_files, no answer needed)")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--max-batch-size", type=int, default=64, help="sequences decoded at once (default 64)")
    p.add_argument("--keep", default=None,
                   help="columns copied to each line, e.g. id,source (default: id-like columns; all: every column)")

    p = sub.add_parser("export", help="a checkpoint (or any model) as a Hugging Face model directory")
    _add_model_args(p)
    p.add_argument("--out", required=True, help="the directory to write")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="auto: the dtype the (run's) model is stored in")
    p.add_argument("--overwrite", action="store_true", help="replace a model directory already at --out")
    p.add_argument("--adapter", action="store_true",
                   help="a LoRA checkpoint: write the adapter (PEFT format) instead of merging it into the base model")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="let a model whose architecture is its own code (auto_map in config.json) run that code")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gyre", description="RL post-training of LLMs on Ray")
    parser.add_argument("--version", action="version", version=f"gyre {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    parser.commands = sub.choices  # each command's own parser (parse_args reads intermixed ones with it)

    p = sub.add_parser("train", help="run training from a config")
    _add_config_args(p)
    _add_start_args(p)

    _add_check(sub)

    p = sub.add_parser("config", help="the configuration reference: a key's type, default and meaning")
    p.add_argument("--describe", nargs="?", const="", required=True, metavar="KEY",
                   help="a dotted key (rollout.async_ratio) or a section (rollout); no KEY: the top-level sections")
    p.add_argument("--pipeline", choices=("rlvr", "sft", "dpo"), default=None,
                   help="the config of gyre train (rlvr, the default), gyre sft or gyre dpo (sft.* and dpo.* keys "
                        "pick theirs)")

    _add_commands(sub)

    p = sub.add_parser("init-model", help="create a small HF model + tokenizer from a preset")
    p.add_argument("--preset", default="tiny", help="tiny | small | base")
    p.add_argument("--out", required=True, help="directory to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-chat-template", action="store_true",
                   help="save the tokenizer without its plain 'role: content' chat template (then prompts are "
                        "plain text, and chat data needs a template of your own)")
    p.add_argument("--overwrite", action="store_true", help="replace what --out already holds")

    p = sub.add_parser("init-data", help="write a bundled synthetic task as JSONL files")
    p.add_argument("--task", default="arithmetic", choices=["arithmetic"])
    p.add_argument("--out", required=True)
    p.add_argument("--digits", type=int, default=2)

    p = sub.add_parser("quickstart", help="create a tiny model and task, then SFT warm-up + GRPO on CPU")
    p.add_argument("--task", choices=("arithmetic", "guess_number", "tool_use"), default="arithmetic",
                   help="arithmetic: RLVR on sums; guess_number: a game; tool_use: an openai-client agent")
    p.add_argument("--out", default=None, help="where the model, data and run go (default runs/<recipe>)")
    p.add_argument("overrides", nargs="*", help="key.path=value overrides of the quickstart recipe")
    _add_start_args(p, "--out")

    p = sub.add_parser("sandbox-serve", help="serve the code sandbox over HTTP for reward.domains.<d>.sandbox.url")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--token-env", default=None,
                   help="environment variable holding the bearer token clients must send (recommended)")
    p.add_argument("--concurrent", type=int, default=None, help="programs run at once (default: CPU count)")

    p = sub.add_parser("report", help="write RUN_DIR/report.html: curves, phase timeline, generations, config")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run's output directory")
    p.add_argument("--out", default=None, help="where to write the page (default RUN_DIR/report.html)")

    p = sub.add_parser("simulate", help="the run's scheduler on a simulated cluster: step time, idleness and "
                                         "staleness at any size, in seconds")
    p.add_argument("config", help="run config (YAML); its simulate section sets model size, device class, task shape")
    p.add_argument("overrides", nargs="*", help="key.path=value overrides, e.g. simulate.model=14b")
    p.add_argument("--devices", default=None, help="device counts to sweep, e.g. 8,32,128,1024 (default: "
                                                   "simulate.devices)")
    p.add_argument("--set", dest="sweep", action="append", default=[], metavar="KEY=V1,V2",
                   help="sweep a key over values, e.g. --set rollout.async_ratio=0,1,2 (repeat for a grid)")
    p.add_argument("--calibrate", default=None, metavar="RUN",
                   help="a real run's directory: the device's decode, training and weight-sync speed, prompt "
                        "lengths, reward latency and response lengths fitted to it (its trained groups replayed); "
                        "or its metrics.jsonl: the response lengths alone")
    p.add_argument("--out", default=None, help="where sweep.csv/json/png go (default: runs/simulate/<config>-<time>)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier sweep's files in --out")

    p = sub.add_parser("ablate", help="run algorithm variants x seeds from one warm start; table + plot")
    p.add_argument("overrides", nargs="*", help="key.path=value overrides of the base config")
    p.add_argument("--config", default=None, help="base config (YAML); default: the quickstart recipe and task")
    p.add_argument("--variants", default="grpo,lite_ppo,reinforce_pp,ppo",
                   help="comma-separated presets, or label=preset (e.g. nokl=grpo)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated RL seeds")
    p.add_argument("--steps", type=int, default=200, help="RL steps per run")
    p.add_argument("--set", nargs=2, action="append", default=[], metavar=("VARIANT", "KEY=VALUE"),
                   help="an override for one variant only, e.g. --set ppo critic.optimizer.lr=0.001")
    p.add_argument("--out", default="runs/ablation")
    _add_start_args(p, "--out")
    return parser


INTERMIXED = ("check", "sft", "dpo", "eval", "generate")
"""Commands whose key=value overrides may come after their flags (``gyre eval M --data f a.b=1``)."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    if argv and argv[0] in INTERMIXED:
        command = parser.commands[argv[0]]
        return command.parse_intermixed_args(argv[1:], argparse.Namespace(command=argv[0]))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.command == "config":  # the schema alone: no torch, no Ray (the error classes below import them)
        from gyre.config.load import ConfigError
        from gyre.config.reference import describe

        try:
            print(describe(args.describe, args.pipeline))
            return 0
        except ConfigError as exc:
            print(f"gyre: error: {exc}", file=sys.stderr)
            return 2
    from gyre.app.evaluate import OutputExistsError
    from gyre.app.export import ExportError
    from gyre.app.interrupt import RunInterrupted, stop_on_signals
    from gyre.app.oserrors import write_failure
    from gyre.app.restart import STANDALONE, interrupted_message, standalone_restart, where_to_resume
    from gyre.app.rundir import RunDirError
    from gyre.cluster.faults import RunFailed
    from gyre.cluster.reward_pool import RewardWorkerError
    from gyre.cluster.runtime import ClusterError
    from gyre.config.load import ConfigError
    from gyre.data.prompts import DataError
    from gyre.envs.protocol import EnvError
    from gyre.models.loading import ModelPathError
    from gyre.rewards.base import RewardSpecError
    from gyre.rewards.checks import RewardFailureError
    from gyre.rewards.sandbox import SandboxUnavailable
    from gyre.tracking.trackers import TrackerError
    from gyre.training.checkpoint import ResumeError

    # Bad input is reported in one paragraph; anything else is a bug and keeps its traceback.
    user_errors = (ConfigError, DataError, ModelPathError, RewardSpecError, ResumeError, RunDirError, ClusterError,
                   RewardFailureError, SandboxUnavailable, EnvError, ExportError, OutputExistsError, TrackerError)
    if args.command in ("init-model", "init-data"):
        user_errors += (ValueError,)
    try:
        with stop_on_signals():
            return _dispatch(args)
    except user_errors as exc:
        print(f"gyre: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # an output path that is a file, read-only or on a full disk: the user's to fix
        if write_failure(exc) is None:
            raise
        print(f"gyre: error: {write_failure(exc)}", file=sys.stderr)
        return 2
    except RunInterrupted as exc:
        print(interrupted_message(exc, args.command, argv), file=sys.stderr)
        return exc.exit_code
    except (RunFailed, RewardWorkerError) as exc:
        output_dir = getattr(exc, "output_dir", None)
        hint = standalone_restart(argv) if args.command in STANDALONE else where_to_resume(output_dir, argv)
        print(f"gyre: error: {exc} {hint}", file=sys.stderr)
        return 1


def _dispatch(args) -> int:
    from gyre.config.load import load_config

    if args.command == "init-model":
        from gyre.models.presets import init_model

        print(f"wrote {init_model(args.preset, args.out, args.seed, not args.no_chat_template, args.overwrite)}")
        return 0
    if args.command == "init-data":
        from gyre.tasks.arithmetic import ArithmeticSpec, write_arithmetic_task

        paths = write_arithmetic_task(args.out, ArithmeticSpec(digits=args.digits))
        print("\n".join(f"wrote {p}" for p in paths.values()))
        return 0
    if args.command == "quickstart":
        return _quickstart(args)
    if args.command == "ablate":
        return _ablate(args)
    if args.command == "simulate":
        return _simulate(args)
    if args.command == "sandbox-serve":
        return _sandbox_serve(args)
    if args.command == "report":
        return _report(args)
    if args.command in ("eval", "generate", "export"):
        return {"eval": _eval, "generate": _generate, "export": _export}[args.command](args)
    if args.command == "sft":
        return _sft(args)
    if args.command == "dpo":
        return _dpo(args)
    cfg = load_config(args.config, args.overrides, schema=None)  # any pipeline's: check reads them all
    from gyre.app import launch

    if args.command == "check":
        launch.check(cfg, args.address, planning=planning_of(args))
        return 0
    summary = launch.train(cfg, args.address, mode=run_mode(args))
    _print_summary(summary)
    return 0


def _report(args) -> int:
    from gyre.config.load import ConfigError
    from gyre.tracking.report import write_report

    run_dir = Path(args.run_dir)
    if not (run_dir / "metrics.jsonl").exists() and not (run_dir / "timeline.jsonl").exists():
        raise ConfigError(f"{run_dir} holds no run (no metrics.jsonl or timeline.jsonl): give the run.output_dir "
                          "of a run, e.g. gyre report runs/quickstart")
    print(f"wrote {write_report(run_dir, args.out)}")
    return 0


def _source(args):
    from gyre.app.model_source import resolve_source

    return resolve_source(args.model, args.step, args.revision)


def _sampling_flags(args, n_key: str | None) -> dict:
    """The flags eval and generate share, as config keys."""
    flags = {"rollout.sampling.max_new_tokens": args.max_new_tokens, "run.seed": args.seed}
    if n_key:
        flags[n_key] = args.n
    return flags


def _eval(args) -> int:
    from gyre.app.command_config import command_config
    from gyre.app.evaluate import EvalOptions, default_out, evaluate_model
    from gyre.config.load import ConfigError

    source = _source(args)
    flags = {**_sampling_flags(args, "validation.samples_per_prompt"), "data.val_files": args.data,
             "validation.temperature": args.temperature, "data.max_val_prompts": args.max_prompts}
    cfg = command_config(source, args.config, args.overrides, flags, needs="data.val_files")
    try:
        ks = tuple(int(k) for k in args.k.split(",") if k.strip()) if args.k else None
    except ValueError:
        raise ConfigError(f"--k {args.k}: give whole numbers separated by commas, e.g. 1,4,8") from None
    report = evaluate_model(cfg, source, EvalOptions(Path(args.out or default_out(source)), ks, args.overwrite))
    print(report.format())
    print("generations: {}  metrics: {}".format(*report.files))
    return 0


def _generate(args) -> int:
    from gyre.app.command_config import command_config
    from gyre.app.generate import GenerateOptions, generate_responses
    from gyre.config.load import ConfigError

    if args.out is None:
        raise ConfigError("gyre generate needs --out FILE.jsonl (where the responses go)")
    if args.n is not None and args.n < 1:
        raise ConfigError(f"--n {args.n}: samples per prompt must be at least 1")
    source = _source(args)
    flags = {**_sampling_flags(args, None), "data.train_files": args.data,
             "rollout.sampling.temperature": args.temperature, "rollout.sampling.top_p": args.top_p,
             "rollout.sampling.top_k": args.top_k, "rollout.max_batch_size": args.max_batch_size}
    cfg = command_config(source, args.config, args.overrides, flags, needs="data.train_files")
    keep = tuple(k.strip() for k in args.keep.split(",") if k.strip()) if args.keep else None
    generate_responses(cfg, source, GenerateOptions(Path(args.out), args.n or 1, keep, args.overwrite))
    return 0


def _export(args) -> int:
    from dataclasses import replace

    from gyre.app.export import ExportSpec, export_model

    spec = ExportSpec(Path(args.out), None if args.dtype == "auto" else args.dtype, args.overwrite,
                      merge_adapter=not args.adapter)
    export_model(replace(_source(args), remote_code=args.trust_remote_code), spec)
    return 0


def _sft(args) -> int:
    from gyre.app.sft_run import train_sft
    from gyre.config.load import load_config
    from gyre.config.sft_schema import SFTJobConfig

    cfg = load_config(args.config, args.overrides, schema=SFTJobConfig)
    summary = train_sft(cfg, args.address, mode="overwrite" if args.overwrite else "fresh")
    if summary.first_loss is not None:
        print(f"SFT loss {summary.first_loss:.4f} -> {summary.last_loss:.4f} over {summary.steps} steps on "
              f"{summary.examples} examples ({summary.seconds / 60:.1f} min)")
    print(f"final model (Hugging Face format): {summary.final_model}")
    return 0


def _dpo(args) -> int:
    from gyre.app.dpo_run import train_dpo
    from gyre.config.dpo_schema import DPOJobConfig
    from gyre.config.load import load_config

    cfg = load_config(args.config, args.overrides, schema=DPOJobConfig)
    summary = train_dpo(cfg, args.address, mode="overwrite" if args.overwrite else "fresh")
    if summary.first_loss is not None:
        print(f"DPO loss {summary.first_loss:.4f} -> {summary.last_loss:.4f}, reward accuracy "
              f"{summary.first_accuracy:.2f} -> {summary.last_accuracy:.2f} over {summary.steps} steps on "
              f"{summary.pairs} pairs ({summary.seconds / 60:.1f} min)")
    print(f"final model (Hugging Face format): {summary.final_model}")
    return 0


def _quickstart(args) -> int:
    from gyre.app import launch
    from gyre.app.quickstarts import QUICKSTARTS

    build, default = QUICKSTARTS[args.task]
    out = Path(args.out or default)
    cfg = build(out, args.overrides)
    summary = launch.train(cfg, None, mode=run_mode(args))
    _print_summary(summary)
    print(f"metrics: {out / 'metrics.jsonl'}  plot: {out / 'metrics.png'}  report: {out / 'report.html'}")
    return 0


def _simulate(args) -> int:
    import time
    from pathlib import Path

    from gyre.config.load import ConfigError, load_config
    from gyre.sim.scenario import calibration, describe, scenario
    from gyre.sim.sweep import HEADER, run_sweep, write_outputs

    base = load_config(args.config, args.overrides)  # a bad config fails here, once, before any sweep
    try:
        devices = [int(d) for d in args.devices.split(",")] if args.devices else [base.simulate.devices]
    except ValueError:
        raise ConfigError(f"--devices takes device counts separated by commas, e.g. 8,32,128; got {args.devices!r}") \
            from None
    if min(devices) < 1:  # an empty cluster would simulate no run at all
        raise ConfigError(f"--devices {args.devices}: every device count must be at least 1, e.g. 8,32,128")
    calibrate = Path(args.calibrate) if args.calibrate is not None else None
    if calibrate is not None and not (calibrate.is_file() or (calibrate / "metrics.jsonl").is_file()):
        raise ConfigError(f"--calibrate {calibrate}: give a gyre run's metrics.jsonl or its run directory")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else Path("runs/simulate") / f"{Path(args.config).stem}-{stamp}"
    if (out / "sweep.csv").exists() and not args.overwrite:
        raise ConfigError(f"{out} holds an earlier sweep (sweep.csv): pass --overwrite to replace it, or another --out")
    try:  # what the simulation cannot take (an unknown model, a bad --set) is the user's to change
        if calibrate is not None:
            print(calibration(base, calibrate).report() + "\n")
        print(describe(scenario(base, devices[0], args.calibrate)) + "\n")
        print(HEADER)
        rows = run_sweep(args.config, args.overrides, devices, args.sweep, args.calibrate)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    for path in write_outputs(rows, out):
        print(f"wrote {path}")
    return 0 if any(r.result is not None for r in rows) else 2


def _ablate(args) -> int:
    from gyre.app.ablation import Variant, run_ablation
    from gyre.config.load import load_config

    out = Path(args.out)
    from gyre.app.quickstarts import quickstart_config

    base = load_config(args.config, args.overrides) if args.config else quickstart_config(out, args.overrides)
    variants = [Variant.parse(v.strip()) for v in args.variants.split(",") if v.strip()]
    labels = {v.label: v for v in variants}
    for label, item in args.set:
        if label not in labels:
            from gyre.config.load import ConfigError

            raise ConfigError(f"--set {label} {item}: no variant labelled {label!r} (variants: {', '.join(labels)})")
        labels[label].overrides.append(item)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    run_ablation(base, variants, seeds, args.steps, out, mode=run_mode(args))
    print((out / "ablation.md").read_text())
    print(f"table: {out / 'ablation.md'}  plot: {out / 'ablation.png'}")
    return 0


def _sandbox_serve(args) -> int:
    import os

    from gyre.config.load import ConfigError
    from gyre.rewards.sandbox.remote import ServerLimits, make_server

    token = None
    if args.token_env:
        token = os.environ.get(args.token_env)
        if not token:
            raise ConfigError(f"--token-env {args.token_env}: that environment variable is empty or not set")
    limits = ServerLimits(concurrent=args.concurrent) if args.concurrent else ServerLimits()
    server = make_server(args.host, args.port, token, limits)
    print(f"gyre sandbox server on http://{args.host}:{server.server_address[1]} "
          f"({'bearer token required' if token else 'no token: anyone who can reach this port may run code'}); "
          "Ctrl-C stops it", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


def _print_summary(summary) -> None:
    first, last = summary.first_val_accuracy, summary.last_val_accuracy
    if first is not None and last is not None:
        print(f"held-out accuracy: {first:.1%} -> {last:.1%} over {summary.steps} RL steps "
              f"({summary.seconds / 60:.1f} min)")
    if summary.final_model:
        print(f"final model (Hugging Face format): {summary.final_model}")


if __name__ == "__main__":
    sys.exit(main())
