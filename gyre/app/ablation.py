"""Ablations: algorithm variants x seeds on one task, from one shared starting model (``gyre ablate``).

The base config's SFT warm-up (if any) runs once; every variant and seed then starts RL from that same
model, so differences come from the algorithm and the RL seed only. Each run writes its own metrics;
the runner collects held-out accuracy against step into a Markdown table, a JSON file and a plot.
Like a single run, an ablation never replaces an earlier one in its directory: resuming keeps the
warm start and every finished run (``result.json``), overwriting moves the earlier ablation aside.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gyre.app.rundir import RunDirError, RunMode, run_artifacts, set_aside
from gyre.config.load import ConfigError, apply_override, validate_config
from gyre.config.presets import PRESET_SECTIONS, PRESETS
from gyre.config.report import resolved_yaml
from gyre.config.schema import RLVRConfig
from gyre.training.checkpoint import ResumeError

ABLATION_FILES = ("ablation.md", "ablation.json", "ablation.png", "base_config.yaml", "warm_start", "warm_start_logs")
"""What an ablation writes at the top of its directory (besides one directory per variant)."""


@dataclass
class Variant:
    """One arm of the ablation: a label, the preset it starts from, and config overrides."""

    label: str
    preset: str
    overrides: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str) -> Variant:
        """``preset`` or ``label=preset``."""
        label, _, preset = text.partition("=")
        preset = preset or label
        if preset not in PRESETS:
            raise ConfigError(f"ablation variant {text!r}: unknown preset {preset!r} (presets: {', '.join(PRESETS)})")
        return cls(label, preset)


@dataclass
class RunResult:
    variant: str
    seed: int
    curve: list[tuple[int, float]]
    """(RL step, held-out accuracy) at every validation."""
    minutes: float


def variant_config(base: RLVRConfig, variant: Variant, seed: int, steps: int, model: str, out: Path) -> RLVRConfig:
    raw = base.model_dump(mode="json")
    raw.pop("sft_warmup", None)
    raw["algorithm"] = {"preset": variant.preset}
    # Keys the variant's preset sets in other sections (asyppo: critic.num_critics) take the preset's value
    # unless the base config wrote them; the dump above holds every default.
    for section, knobs in PRESET_SECTIONS.get(variant.preset, {}).items():
        for key in set(knobs) - getattr(base, section).model_fields_set:
            raw[section].pop(key, None)
    if model != base.model.path:  # the warm start is a local directory: the Hub revision named the input
        raw["model"]["revision"] = None
    for item in [f"run.seed={seed}", f"run.steps={steps}", f"model.path={model}", f"run.output_dir={out}",
                 f"run.name={variant.label}-seed{seed}", "logging.progress=false", "logging.trackers=[]",
                 "logging.plot=false", "checkpoint.every=0", *variant.overrides]:
        apply_override(raw, item)
    return validate_config(raw, source=f"ablation variant {variant.label}")


def warm_start(base: RLVRConfig, out: Path, echo: Callable[[str], None]) -> str:
    """The shared starting model: the base config's SFT warm-up, run once (or the model itself)."""
    from gyre.app import launch
    from gyre.models.loading import ModelPathError, check_model_dir

    if base.sft_warmup is None:
        return base.model.path
    target = out / "warm_start"
    try:
        check_model_dir(target, key="warm start")
        echo(f"reusing the warm-started model in {target}")
        return str(target)
    except ModelPathError:
        partial = run_artifacts(out, ("warm_start", "warm_start_logs"))
        if partial:  # a warm-up stopped before it saved the model
            echo(f"the warm start in {out} is incomplete: moved it to {set_aside(out, partial)}")
    launch.warm_up(base, target, echo)
    return str(target)


def ablation_artifacts(out: Path) -> list[Path]:
    """What an earlier ablation left in ``out``: its files, and each variant directory holding a run."""
    if not out.is_dir():
        return []
    variants = [d for d in sorted(out.iterdir()) if d.is_dir() and d.name not in ABLATION_FILES
                and any(s.is_dir() and run_artifacts(s) for s in d.iterdir())]
    return run_artifacts(out, ABLATION_FILES) + variants


def prepare_ablation_dir(out: Path, mode: RunMode, echo: Callable[[str], None]) -> bool:
    """Refuse, resume or set aside an earlier ablation in ``out``, as for a run; True when resuming."""
    found = ablation_artifacts(out)
    if found and mode == "fresh":
        raise RunDirError(f"{out} already holds an ablation ({', '.join(p.name for p in found[:4])}). Add --resume "
                          "to keep its warm start and finished runs and run the rest, or --overwrite to move it to "
                          f"{out}.old-<time> (nothing is deleted); or choose another --out.")
    if not found and mode == "resume":
        raise ResumeError(f"--resume: no ablation in {out} to continue; run without --resume to start one "
                          "(or use --resume auto).")
    if found and mode == "overwrite":
        echo(f"--overwrite: moved the previous ablation's files from {out} to {set_aside(out, found)}")
    return mode in ("resume", "auto")


def run_ablation(base: RLVRConfig, variants: list[Variant], seeds: list[int], steps: int, out: Path,
                 echo: Callable[[str], None] = print, mode: RunMode = "fresh") -> list[RunResult]:
    from gyre.app import launch

    resume = prepare_ablation_dir(out, mode, echo)
    out.mkdir(parents=True, exist_ok=True)
    model = warm_start(base, out, echo)
    results = []
    for variant in variants:
        for seed in seeds:
            run_dir = out / variant.label / f"seed{seed}"
            if resume and (run_dir / "result.json").is_file():
                results.append(RunResult(**json.loads((run_dir / "result.json").read_text())))
                echo(f"== {variant.label}, seed {seed}: kept the finished run in {run_dir}")
                continue
            cfg = variant_config(base, variant, seed, steps, model, run_dir)
            echo(f"== {variant.label} (preset {variant.preset}), seed {seed}: {run_dir}")
            t0 = time.perf_counter()
            launch.train(cfg, mode="auto" if resume else "fresh", echo=lambda s: None)
            results.append(RunResult(variant.label, seed, read_curve(run_dir / "metrics.jsonl"),
                                     (time.perf_counter() - t0) / 60))
            (run_dir / "result.json").write_text(json.dumps(results[-1].__dict__))
            echo(f"   held-out accuracy {results[-1].curve[0][1]:.1%} -> {results[-1].curve[-1][1]:.1%} "
                 f"({results[-1].minutes:.1f} min)")
    write_report(results, out, base)
    return results


def read_curve(metrics: Path) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [(r["step"], r["val/accuracy"]) for r in records if "val/accuracy" in r]


def summary_table(results: list[RunResult]) -> str:
    lines = ["| variant | seeds | start | final (mean ± std) | best (mean) | final per seed | min/run |",
             "|---|---|---|---|---|---|---|"]
    for label in dict.fromkeys(r.variant for r in results):
        runs = [r for r in results if r.variant == label]
        final = [r.curve[-1][1] for r in runs]
        best = [max(a for _, a in r.curve) for r in runs]
        spread = statistics.stdev(final) if len(final) > 1 else 0.0
        lines.append(f"| {label} | {len(runs)} | {statistics.mean(r.curve[0][1] for r in runs):.1%} "
                     f"| {statistics.mean(final):.1%} ± {spread:.1%} | {statistics.mean(best):.1%} "
                     f"| {', '.join(f'{a:.1%}' for a in final)} | {statistics.mean(r.minutes for r in runs):.1f} |")
    return "\n".join(lines)


def write_report(results: list[RunResult], out: Path, base: RLVRConfig) -> None:
    table = summary_table(results)
    (out / "ablation.md").write_text(f"# Ablation: held-out accuracy\n\n{table}\n")
    (out / "ablation.json").write_text(json.dumps([r.__dict__ for r in results], indent=1))
    (out / "base_config.yaml").write_text(resolved_yaml(base))
    plot_curves(results, out / "ablation.png")


def plot_curves(results: list[RunResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label in dict.fromkeys(r.variant for r in results):
        runs = [r for r in results if r.variant == label]
        steps = [s for s, _ in runs[0].curve]
        per_step = [[dict(r.curve).get(s) for r in runs] for s in steps]
        per_step = [[a for a in accs if a is not None] for accs in per_step]
        mean = [statistics.mean(a) for a in per_step]
        line, = ax.plot(steps, mean, label=f"{label} ({len(runs)} seeds)")
        ax.fill_between(steps, [min(a) for a in per_step], [max(a) for a in per_step], alpha=0.15,
                        color=line.get_color())
    ax.set_xlabel("RL step")
    ax.set_ylabel("held-out accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("mean over seeds; band: min to max")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
