"""``gyre eval``: a model or a run's checkpoint on held-out prompts, scored like the run's validation.

The prompts, column mapping and reward come from a run config's sections (``command_config``). Sampling
and scoring are the run's own: the rollout engine (``RolloutWorker``) and the reward workers of every
domain, driven by ``RolloutMachine.evaluate`` exactly as validation drives them, here as in-process role
groups (``RoleGroup.local``: one engine on this machine's first GPU, or the CPU; reward functions in
their usual child processes). With the run's config and seed, the samples are the ones its validation
drew from the same weights.

Reported over prompts: accuracy (the fraction of samples correct), mean@n (the mean reward of the n
samples), the unbiased pass@k for k up to n (``gyre.algos.pass_at_k``), response lengths and reward
failures, overall and per tag; every sample is written to ``generations.jsonl``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gyre.algos.pass_at_k import default_ks, mean_at_k, mean_pass_at_k
from gyre.app.model_source import ModelSource
from gyre.config.schema import RLVRConfig
from gyre.types import Group, PromptRecord

OUTPUT_FILES = ("generations.jsonl", "metrics.json")


class OutputExistsError(ValueError):
    """A command would overwrite files a user has; the message names them and the flag that allows it."""


@dataclass(frozen=True)
class EvalOptions:
    out: Path
    """The directory that receives generations.jsonl and metrics.json."""
    ks: tuple[int, ...] | None = None
    """The k of each pass@k; None: 1, 2, 4, ... below n, and n."""
    overwrite: bool = False
    """Replace generations.jsonl and metrics.json when ``out`` holds them."""


@dataclass
class EvalReport:
    model: str
    samples_per_prompt: int
    temperature: float
    overall: dict[str, float]
    by_tag: dict[str, dict[str, float]] = field(default_factory=dict)
    files: tuple[Path, ...] = ()

    def to_dict(self) -> dict:
        return {"model": self.model, "samples_per_prompt": self.samples_per_prompt, "temperature": self.temperature,
                "overall": self.overall, "by_tag": self.by_tag}

    def format(self) -> str:
        """A table: one row overall, one per tag."""
        keys = ["prompts", *["accuracy"] * ("accuracy" in self.overall), f"mean@{self.samples_per_prompt}",
                *[k for k in self.overall if k.startswith("pass@")]]
        rows = [("all", self.overall), *((f"tag {tag}", m) for tag, m in self.by_tag.items())]
        width = max(len(name) for name, _ in rows)
        lines = [" " * width + "".join(f"{k:>10}" for k in keys)]
        for name, m in rows:
            # a tag whose reward judges no correctness has no accuracy or pass@k: a dash
            cells = "".join(f"{m[k]:>10}" if k == "prompts" else f"{m[k]:>10.3f}" if k in m else f"{'-':>10}"
                            for k in keys)
            lines.append(f"{name:<{width}}{cells}")
        head = (f"eval of {self.model}: {self.overall['prompts']} prompts x {self.samples_per_prompt} samples "
                f"(temperature {self.temperature:g})")
        return "\n".join([head, *lines])


def evaluate_model(cfg: RLVRConfig, source: ModelSource, options: EvalOptions,
                   echo: Callable[[str], None] = print) -> EvalReport:
    """Sample and score ``cfg.validation.samples_per_prompt`` responses to every held-out prompt; write
    generations.jsonl and metrics.json under ``options.out``."""
    from gyre.app.export import loadable_model

    n = cfg.validation.samples_per_prompt
    ks = _check_ks(options.ks or tuple(default_ks(n)), n)
    files = claim_outputs(Path(options.out), OUTPUT_FILES, options.overwrite)
    cfg, prompts = prepare(cfg, echo)
    with loadable_model(source) as model_dir:
        groups = sample_and_score(cfg, model_dir, prompts)
    report = EvalReport(source.label, n, cfg.validation.temperature, group_metrics(groups, ks),
                        {tag: group_metrics(mine, ks) for tag, mine in _by_tag(groups).items()}, files)
    _warn_failures(groups, echo)
    files[0].parent.mkdir(parents=True, exist_ok=True)
    write_generations(files[0], groups)
    files[1].write_text(json.dumps(report.to_dict(), indent=1) + "\n")
    return report


def default_out(source: ModelSource) -> Path:
    """eval/<name>, the name saying what was evaluated: <run>-step<N>, <run>-final, or the model's name."""
    from gyre.models.hub import cached_repo_of

    if source.kind == "checkpoint":
        name = f"{source.run_dir.name}-step{source.step}"
    elif source.run_dir is not None:
        name = f"{source.run_dir.name}-final"
    else:
        cached = cached_repo_of(source.path)
        name = cached[0].replace("/", "--") if cached else source.path.name
    return Path("eval") / name


def claim_outputs(out: Path, names: Sequence[str], overwrite: bool) -> tuple[Path, ...]:
    """The paths of ``names`` in ``out``, refusing to replace any that exist without ``overwrite`` (checked
    before any work; the directory is made when they are written)."""
    paths = tuple(out.expanduser().resolve() / name for name in names)
    taken = [str(p) for p in paths if p.exists()]
    if taken and not overwrite:
        raise OutputExistsError(f"{', '.join(taken)} already exist(s); add --overwrite to replace, or choose another "
                                "--out")
    if any(p.exists() and not p.is_file() for p in paths):
        raise OutputExistsError(f"{', '.join(taken)}: not a file; choose another --out")
    return paths


def _check_ks(ks: Sequence[int], n: int) -> tuple[int, ...]:
    from gyre.config.load import ConfigError

    bad = [k for k in ks if not 1 <= k <= n]
    if bad:
        raise ConfigError(f"--k {','.join(map(str, ks))}: pass@k needs 1 <= k <= the samples per prompt ({n}); raise "
                          "--n (validation.samples_per_prompt) or drop k > n")
    return tuple(sorted(set(ks)))


def prepare(cfg: RLVRConfig, echo: Callable[[str], None]) -> tuple[RLVRConfig, list[PromptRecord]]:
    """Paths resolved, the model's headers and the reward functions checked, the held-out prompts loaded
    and their ground truths checked: everything that can fail before a model is loaded."""
    from gyre.app.preflight import check_code_sandboxes, check_ground_truths, check_models, resolve_paths
    from gyre.models.loading import load_tokenizer
    from gyre.rewards.registry import check_functions
    from gyre.training.run_data import data_renderer, held_out_prompts

    cfg = resolve_paths(cfg)
    check_models(cfg)
    for domain in cfg.reward.domains.values():
        check_functions(domain)
    tokenizer = load_tokenizer(cfg.model.tokenizer_path or cfg.model.path, cfg.model.trust_remote_code)
    prompts, overlong = held_out_prompts(cfg, data_renderer(cfg, tokenizer))
    check_ground_truths(cfg, prompts)
    check_code_sandboxes(cfg, prompts, echo)
    echo(f"data: {len(prompts)} prompts" + overlong.describe(cfg.data.max_prompt_tokens))
    return cfg, prompts


def sample_and_score(cfg: RLVRConfig, model_dir: Path, prompts: list[PromptRecord]) -> list[Group]:
    """Every prompt's validation.samples_per_prompt samples from the model in ``model_dir``, scored by the
    reward domains of ``cfg``: in-process engine and reward groups, driven as validation drives them."""
    import torch

    from gyre.cluster.faults import Watchdog
    from gyre.cluster.group import RoleGroup
    from gyre.cluster.reward_pool import RewardPool
    from gyre.cluster.roles import reward_scorers, rollout_worker_args
    from gyre.cluster.workers import RolloutWorker
    from gyre.config.derive import detect_local_devices
    from gyre.pipelines.rlvr import validation_params
    from gyre.rollout.driver import RolloutDriver
    from gyre.rollout.machine import RolloutMachine
    from gyre.rollout.scheduler import ScheduleSpec

    kind = detect_local_devices(cfg)[0]
    watchdog = Watchdog.from_config(cfg.watchdog)
    args = rollout_worker_args(cfg, 0, str(model_dir), kind, torch.get_num_threads(), False)
    engines = RoleGroup.local("rollout", RolloutWorker, [args], watchdog)
    rewards: dict[str, RoleGroup] = {}
    try:
        rewards = local_reward_groups(cfg, kind, watchdog)
        params, n = validation_params(cfg), cfg.validation.samples_per_prompt
        driver = RolloutDriver(engines, RewardPool(reward_scorers(cfg, rewards)), cfg.rollout.emit_every,
                               replaceable=False)
        machine = RolloutMachine(driver, ScheduleSpec(n, len(prompts), params, cfg.run.seed), lambda k: [])
        try:
            return machine.evaluate(prompts, params, n)
        finally:
            machine.close()
    finally:
        for group in (engines, *rewards.values()):
            group.kill()


def local_reward_groups(cfg: RLVRConfig, device_kind: str, watchdog) -> dict:
    """Each reward domain's workers in this process: function workers (their child processes score), or the
    judge or reward model on this machine's device."""
    import torch

    from gyre.cluster.group import RoleGroup
    from gyre.cluster.roles import reward_worker_args
    from gyre.cluster.workers import ModelRewardWorker, RewardWorker

    groups = {}
    try:
        for name, domain in cfg.reward.domains.items():
            if domain.model_role is None:
                group = RoleGroup.local_unplaced(f"reward.{name}", RewardWorker, domain.workers,
                                                 reward_worker_args(domain), max_restarts=3)
            else:
                args = (domain.model_role, domain.scoring_model, device_kind, torch.get_num_threads(), cfg.model.dtype)
                group = RoleGroup.local(f"{domain.model_role}.{name}", ModelRewardWorker, [args])
            group.watchdog = watchdog
            groups[name] = group
    except BaseException:
        for group in groups.values():
            group.kill()
        raise
    return groups


def group_metrics(groups: Sequence[Group], ks: Sequence[int]) -> dict:
    """Accuracy, mean@n of the reward, pass@k, lengths and reward failures of scored groups of n samples."""
    samples = [t for g in groups for t in g.trajectories]
    # Accuracy and pass@k count only what the reward judged correct, over the groups it judged (a score is
    # never read as correctness); with a reward that never judges (a plain float) they are absent, and
    # positive_frac (score > 0) says what share scored at all.
    correct = [[t.reward.correct is True for t in g.trajectories] for g in groups
               if any(t.reward.correct is not None for t in g.trajectories)]
    n = len(groups[0].trajectories)
    out = {"prompts": len(groups), **({"accuracy": mean_at_k(correct)} if correct else {}),
           f"mean@{n}": mean_at_k([[t.reward.score for t in g.trajectories] for g in groups])}
    if correct:
        out.update({f"pass@{k}": mean_pass_at_k(correct, k) for k in ks})
    return {**out, "positive_frac": sum(t.reward.score > 0 for t in samples) / len(samples),
            "response_length_mean": sum(len(t.response_ids) for t in samples) / len(samples),
            "truncated_frac": sum(t.finish_reason == "length" for t in samples) / len(samples),
            "reward_errors": sum(t.reward.status == "error" for t in samples),
            "reward_timeouts": sum(t.reward.status == "timeout" for t in samples)}


def _by_tag(groups: Sequence[Group]) -> dict[str, list[Group]]:
    """Groups by their prompt's tag, when any prompt has one (untagged ones under "(none)")."""
    if all(g.prompt.tag is None for g in groups):
        return {}
    tags: dict[str, list[Group]] = {}
    for g in groups:
        tags.setdefault(g.prompt.tag or "(none)", []).append(g)
    return dict(sorted(tags.items()))


def write_generations(path: Path, groups: Sequence[Group]) -> None:
    """One JSON line per sample: prompt, response, reward, correct, tag, and what identifies it."""
    with path.open("w") as fh:
        for g in groups:
            for t in g.trajectories:
                r = t.reward
                row = {"id": g.prompt.uid, "sample": t.sample_index, "tag": g.prompt.tag, "prompt": g.prompt.question
                       or g.prompt.prompt_text, "response": t.response_text, "reward": r.score, "correct": r.correct,
                       "ground_truth": g.prompt.ground_truth, "finish_reason": t.finish_reason}
                if r.status != "ok":
                    row.update(reward_status=r.status, reward_error=r.error)
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def _warn_failures(groups: Sequence[Group], echo: Callable[[str], None]) -> None:
    failed = [t for g in groups for t in g.trajectories if t.reward.status != "ok"]
    if failed:
        first = failed[0]
        echo(f"warning: {len(failed)} rewards failed and scored 0 (e.g. {first.prompt.uid}: {first.reward.status} "
             f"{first.reward.error or ''}); see reward_status in generations.jsonl")
