"""What a stopped or failed command prints: where its run stands and the exact command that continues it."""

from __future__ import annotations

import shlex
import signal


def interrupted_message(exc, command: str, argv: list[str]) -> str:
    """Where a stopped run stands: its last checkpoint and the exact command that continues it."""
    from gyre.training.checkpoint import CheckpointManager, ResumeError

    head = f"gyre: stopped by {signal.Signals(exc.signum).name}"
    if command == "sandbox-serve":
        return f"{head}: the sandbox server is down."
    if command == "ablate":  # resume auto: keeps what the ablation finished, if it got that far
        return f"{head}. Continue the ablation (finished runs and the warm start are kept) with: " \
               f"{resume_command(argv, auto=True)}"
    if exc.output_dir is None:
        return f"{head} before a run started; nothing was written. Run the same command to start again."
    head += "; actors stopped and Ray shut down."
    if command in STANDALONE:
        return f"{head} {standalone_restart(argv)}"
    latest = CheckpointManager(exc.output_dir).latest()
    if latest is None:
        return (f"{head} No checkpoint was saved yet in {exc.output_dir}; start again with: "
                f"{resume_command(argv, auto=True)}")
    try:
        step = f" (step {CheckpointManager(exc.output_dir).load_state(latest).step})"
    except ResumeError:
        step = ""
    return f"{head} Last checkpoint: {latest}{step}. Continue with: {resume_command(argv)}"


def where_to_resume(output_dir, argv: list[str]) -> str:
    """The last checkpoint of a run that stopped on a fault, and the command that continues it."""
    from gyre.training.checkpoint import CheckpointManager

    latest = CheckpointManager(output_dir).latest() if output_dir is not None else None
    if latest is None:
        return f"Fix the cause, then continue with: {resume_command(argv, auto=True)}"
    return f"Last checkpoint: {latest}. Fix the cause, then continue with: {resume_command(argv)}"


STANDALONE = ("sft", "dpo")
"""Commands whose runs keep no checkpoints (a stopped one starts again)."""


def standalone_restart(argv: list[str]) -> str:
    """SFT and DPO runs keep no checkpoints: the command that starts one again (setting the stopped one aside)."""
    kept = [arg for arg in argv if arg != "--overwrite"]
    what = argv[0].upper() if argv and argv[0] in STANDALONE else "SFT"
    return f"{what} runs keep no checkpoints; start again with: {shlex.join(['gyre', *kept, '--overwrite'])}"


def resume_command(argv: list[str], auto: bool = False) -> str:
    """``argv`` as a gyre command line with its start flags replaced by --resume (or --resume auto)."""
    kept = []
    for i, arg in enumerate(argv):
        after_resume = arg == "auto" and i > 0 and argv[i - 1] == "--resume"
        if arg not in ("--overwrite", "--resume", "--resume=auto") and not after_resume:
            kept.append(arg)
    return shlex.join(["gyre", *kept, "--resume", *(["auto"] if auto else [])])
