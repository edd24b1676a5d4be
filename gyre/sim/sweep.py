"""``gyre simulate``'s sweeps: every combination of device counts and ``--set key=v1,v2`` values, one
simulation each, as a table (printed, and ``sweep.csv`` / ``sweep.json``) and a figure (``sweep.png``:
throughput, step time, rollout idleness and staleness against device count, one line per setting). Each
setting's memory per device is estimated on its simulated layout (``gyre.sim.memory``): one that does not
fit is refused with the numbers, as ``gyre check`` refuses the run.
"""

from __future__ import annotations

import csv
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

from gyre.config.load import load_config
from gyre.sim.memory import MemoryFit, spec_fit
from gyre.sim.run import SimResult, simulate
from gyre.sim.scenario import scenario


def split_values(text: str) -> list[str]:
    """``a=1,2,[3,4]`` -> ["1", "2", "[3,4]"]: commas inside brackets or braces belong to a value."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[{("
        depth -= ch in "]})"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [*out, cur]


def settings(sets: list[str]) -> list[dict[str, str]]:
    """Every combination of the ``--set key=v1,v2`` values, as {key: value} (one empty setting without)."""
    axes = []
    for item in sets:
        key, sep, values = item.partition("=")
        if not sep or not key or not values:
            raise ValueError(f"--set takes key=value1,value2,...; got {item!r}")
        axes.append([(key.strip(), v.strip()) for v in split_values(values)])
    return [dict(combo) for combo in itertools.product(*axes)] if axes else [{}]


@dataclass
class SweepRow:
    setting: dict[str, str]
    devices: int
    result: SimResult | None
    error: str | None = None
    """Why the setting could not be simulated (e.g. tail batching with asynchrony, or it does not fit)."""
    memory: MemoryFit | None = None
    """Its memory estimate on the simulated layout (None on CPU slots)."""

    @property
    def label(self) -> str:
        return ", ".join(f"{k.rpartition('.')[2]}={v}" for k, v in self.setting.items()) or "config"

    def record(self) -> dict:
        out = {"setting": self.label, "devices": self.devices, **{f"set:{k}": v for k, v in self.setting.items()}}
        r = self.result
        if self.memory is not None:
            m = self.memory
            out.update(mem_gb=m.peak_gb, train_gb=m.train_gb, rollout_gb=m.rollout_gb,
                       **{f"mem:{role}": text for role, text in m.roles.items()})
        if r is None:
            return {**out, "error": self.error}
        violations = sum(s.stats.get("staleness/violations", 0) for s in r.steps)
        return {**out, "layout": r.spec.layout.describe(), "step_s": r.step_s, "generate_s": r.mean("generate_s"),
                "train_s": r.mean("train_s"), "samples_per_s": r.samples_per_s,
                "trained_tokens_per_s": r.trained_tokens_per_s,
                "rollout_idle": 1 - r.mean("rollout_busy"), "trainer_idle": 1 - r.trainer_busy,
                "device_idle": r.device_idle,
                "staleness_mean": r.mean("staleness/mean"), "staleness_max": r.staleness_max, "violations": violations,
                "tokens_generated": r.mean("rollout/tokens_generated"),
                "tokens_wasted": r.mean("rollout/tokens_wasted"),
                "wasted_share": r.wasted_share, "groups_expired": r.mean("rollout/groups_expired"),
                "cost_per_1k": r.cost_per_1k_samples,
                "sim_wall_s": r.wall_s, "sim_s_per_step": r.wall_s / len(r.steps)}


def run_sweep(config: str | Path, overrides: list[str], devices: list[int], sets: list[str],
              calibrate: str | Path | None = None, echo=print) -> list[SweepRow]:
    rows = []
    for setting in settings(sets):
        cfg = load_config(config, [*overrides, *(f"{k}={v}" for k, v in setting.items())])
        for n in devices:
            try:
                spec = scenario(cfg, n, calibrate)
                fit, device = spec_fit(cfg, spec)
                if fit is not None and not fit.fits:  # gyre check would refuse the run: so does the sweep
                    rows.append(SweepRow(setting, n, None, fit.refusal(device), fit))
                else:
                    rows.append(SweepRow(setting, n, simulate(spec), memory=fit))
            except ValueError as exc:  # a setting the scheduler or the placement rejects
                rows.append(SweepRow(setting, n, None, str(exc)))
            echo(format_row(rows[-1], rows))
    return rows


HEADER = (f"{'setting':<28}{'devices':>8}  {'layout':<22}{'step s':>9}{'samples/s':>11}{'tokens/s':>10}{'vs first':>9}"
          f"{'wasted':>8}{'device idle':>12}{'rollout idle':>13}{'train idle':>11}{'stale':>7}{'GB train/roll':>14}"
          f"{'$/1k':>8}{'sim s':>7}")
"""Columns: tokens/s are response tokens trained on per second, and vs first compares them with the first
setting's (samples/s flatter a schedule that trains short answers and wastes long ones); wasted is the
share of generated tokens that never trained; idle is the share of the step's time a role (or, device
idle, all devices together) does no work: on shared devices rollout is idle while the policy trains and
the reverse; GB train/roll is gyre check's memory estimate per device on the simulated layout, of the
training side (the trainer roles) and of the rollout side (an engine); on shared devices the larger (or,
without offload, their sum) must fit, else the setting is refused with the numbers (- on CPU slots)."""


def format_row(row: SweepRow, rows: list[SweepRow]) -> str:
    if row.result is None:
        return f"{row.label:<28}{row.devices:>8}  skipped: {row.error}"
    r = row.record()
    first = next((x for x in rows if x.devices == row.devices and x.result is not None), row)
    ratio = r["trained_tokens_per_s"] / first.result.trained_tokens_per_s
    return (f"{row.label:<28}{row.devices:>8}  {r['layout']:<22}{r['step_s']:>9.1f}{r['samples_per_s']:>11.1f}"
            f"{r['trained_tokens_per_s']:>10.0f}{ratio:>8.2f}x{r['wasted_share']:>8.0%}{r['device_idle']:>12.0%}{r['rollout_idle']:>13.0%}{r['trainer_idle']:>11.0%}"
            f"{r['staleness_mean']:>7.2f}{_gb(row.memory):>14}"
            f"{r['cost_per_1k']:>8.2f}{r['sim_wall_s']:>7.2f}")


def _gb(fit: MemoryFit | None) -> str:
    return f"{fit.train_gb:.1f}/{fit.rollout_gb:.1f}" if fit is not None else "-"


def write_outputs(rows: list[SweepRow], out: Path) -> list[Path]:
    """sweep.csv, sweep.json and sweep.png in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    records = [r.record() for r in rows]
    keys = list(dict.fromkeys(k for rec in records for k in rec))
    with (out / "sweep.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(records)
    (out / "sweep.json").write_text(json.dumps(records, indent=1))
    paths = [out / "sweep.csv", out / "sweep.json"]
    if any(r.result is not None for r in rows):
        paths.append(plot(rows, out / "sweep.png"))
    return paths


def plot(rows: list[SweepRow], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("samples_per_s", "samples / s"), ("step_s", "step time (s)"), ("device_idle", "device idle"),
              ("staleness_mean", "mean staleness (versions)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    by_label: dict[str, list[dict]] = {}
    for row in rows:
        if row.result is not None:
            by_label.setdefault(row.label, []).append(row.record())
    for ax, (key, title) in zip(axes, panels, strict=True):
        for label, recs in by_label.items():
            recs = sorted(recs, key=lambda r: r["devices"])
            ax.plot([r["devices"] for r in recs], [r[key] for r in recs], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("devices")
        ax.set_title(title)
        if key == "device_idle":
            ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
