"""Calibrating the simulator from a real run: the machine's speed and the task's shape, from what a gyre run
writes in its directory (``gyre simulate --calibrate RUN_DIR``).

Read: ``metrics.jsonl`` (each step's phase times), ``timeline.jsonl`` (the workers' spans,
``gyre.tracking.timeline``), ``ledger.jsonl`` (every trained group's response lengths, by prompt uid) and
``resolved_config.yaml`` (the run's model, layout, engine and data, whose prompts are tokenised again for
their lengths). Step 1 is left out of every fit (it pays for start-up). What is fitted, per RL step ``s``:

* decoding, from the generate spans of a synchronous run (each engine's busy seconds in the step; the
  slowest engine's gates it) against the step's trained samples (prompt p, response r; E engines):
  ``busy_s = a x L_s + b x sum(p + r) / E``, L_s the step's longest response (its decoding steps), the sum
  the tokens an engine prefills and decodes, least squares with a, b >= 0. When the steps determine both
  (each within ``DETERMINED`` of its standard error), a is the cost model's additive step's fixed cost
  (step_overhead_s) and b a token's compute (peak_tflops = 2 P / b); the KV read per context token is
  folded into b (one run's contexts grow with its tokens and longest samples: a third term swung between
  runs of one setting). When they do not (a run whose steps all run to the token cap has L_s the same in
  every step: the split between a step's and a token's cost is then noise), the base class's own engine
  is priced on the same samples (``base_decode_s``) and scaled to the spans: its shape (a step, a row, a
  context token), the run's level. The calibration run's engine class is divided out either way (another
  backend on the fitted device keeps its relative cost). An asynchronous run's spans cover several steps'
  samples: from it, decoding is a throughput alone (seconds per token).
* training, from the train and log-prob spans (the busiest trainer lane per step) against the FLOPs the
  simulator's learner charges for that step's rows (``gyre.sim.learner``, the run's own passes and
  micro-batches): ``busy_s = o + flops / F``; F sets train_mfu. train_overhead_s is the rest of the
  trainer's side of a step, as the simulator's train_s stands for it: the mean of ``time/step`` less the
  engines' busy seconds (asynchronous: ``time/generate``), ``time/weight_sync``, ``time/reward`` and
  ``flops / F`` (collation, advantages, the driver's calls).
* the weight update: the mean ``time/weight_sync`` (the trainer's wait) sets the class's call_s, less what
  the run's transport moves at the base class's links (a hybrid run moves nothing: its links are not
  fitted); when the links alone would take longer than measured, they are scaled down to it.
* the task: prompt lengths (mean, cv) over the trained groups' prompts; reward latency, the median of the
  reward spans (a span is a call, or calls less than 20 ms apart merged into a busy interval: the median
  is a call's; their spread is not a sample's, so the cv stays the config's; not fitted when the run
  recorded none); response lengths by ``fit_lengths`` of the metrics, and the ledger's groups replayed
  (``RecordedWorkload``).

A fitted figure replaces the base device class's (``simulate.device``); the rest of it (memory, links
not fitted, price) is kept, and ``Calibration.report`` says which is which and from how many spans.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from gyre.config.catalog import DeviceClass, ModelShape, engine_class
from gyre.sim.cost import CostModel
from gyre.sim.workload import WorkloadSpec, fit_lengths, recorded_groups
from gyre.tracking.logger import read_jsonl_tolerant
from gyre.tracking.timeline import Span, read_spans

Group = tuple[int, tuple[int, ...]]
"""(prompt tokens, response tokens of each sample) of one trained group."""
ENGINE_ROLES = ("rollout", "policy")
"""Roles whose generate spans are an engine's decoding (a hybrid run's policy ranks decode)."""
TRAINER_ROLES = ("policy", "reference", "critic", "teacher")
FAST_BANDWIDTH_GBPS = 1e9
"""A memory bandwidth that makes reading cost nothing: the per-token term already holds it."""
DETERMINED = 0.25
"""A two-term decode fit is kept when each term's standard error is at most this share of it."""
ALIKE = 0.1
"""Steps whose FLOPs spread less than this share of their mean cannot separate a fixed cost from a rate."""


# ---- least squares ----------------------------------------------------------------------------------------
def nonneg_lstsq(xs: Sequence[Sequence[float]], ys: Sequence[float]) -> tuple[list[float], float]:
    """Least squares ``ys ~ xs @ coef`` with every coefficient >= 0 (the best of the exact solutions over the
    subsets of columns: a fit here has at most three), and the mean |residual| in percent of ``ys``."""
    k = len(xs[0]) if xs else 0
    best: tuple[float, list[float]] | None = None
    for mask in range(1, 1 << k):
        cols = [j for j in range(k) if mask >> j & 1]
        if len(cols) > len(ys):
            continue
        sol = _solve([[row[j] for j in cols] for row in xs], ys)
        if sol is None or min(sol) < 0:
            continue
        coef = [0.0] * k
        for j, v in zip(cols, sol):
            coef[j] = v
        sse = sum((sum(c * x for c, x in zip(coef, row)) - y) ** 2 for row, y in zip(xs, ys))
        if best is None or sse < best[0] - 1e-18:
            best = (sse, coef)
    coef = best[1] if best is not None else [0.0] * k
    res = [abs(sum(c * x for c, x in zip(coef, row)) - y) / y for row, y in zip(xs, ys) if y > 0]
    return coef, 100 * statistics.mean(res) if res else 0.0


def _solve(xs: list[list[float]], ys: Sequence[float]) -> list[float] | None:
    """Plain least squares by the normal equations on scaled columns (None: the columns are dependent)."""
    k = len(xs[0])
    scale = [math.sqrt(sum(row[j] ** 2 for row in xs)) or 1.0 for j in range(k)]
    gram = [[sum(r[i] * r[j] for r in xs) / (scale[i] * scale[j]) for j in range(k)] for i in range(k)]
    sol = _solve_square(gram, [sum(r[i] * y for r, y in zip(xs, ys)) / scale[i] for i in range(k)], 1e-12)
    return None if sol is None else [v / c for v, c in zip(sol, scale)]


def _solve_square(a: list[list[float]], b: list[float], tiny: float = 1e-300) -> list[float] | None:
    """x with a x = b (Gauss-Jordan, partial pivoting), None when a pivot is below ``tiny`` (a is singular)."""
    k = len(b)
    m = [[*row, v] for row, v in zip(a, b)]
    for i in range(k):
        p = max(range(i, k), key=lambda r: abs(m[r][i]))
        if abs(m[p][i]) < tiny:
            return None
        m[i], m[p] = m[p], m[i]
        for r in range(k):
            if r != i:
                f = m[r][i] / m[i][i]
                m[r] = [x - f * y for x, y in zip(m[r], m[i])]
    return [m[i][k] / m[i][i] for i in range(k)]


# ---- what a run directory holds -------------------------------------------------------------------------
@dataclass
class RunRecords:
    """A run directory's records, read once."""

    path: Path
    steps: dict[int, dict]
    """metrics.jsonl's training step records by step."""
    spans: list[Span]
    groups: dict[int, list[Group]]
    """The ledger's trained groups by step (prompt tokens -1 when the prompt's length is unknown)."""
    config: object | None
    """The run's resolved config (an RLVRConfig), None when it is not there or no longer loads."""
    prompt_note: str = ""
    """Why prompt lengths are unknown, when they are."""

    @classmethod
    def read(cls, run_dir: str | Path) -> RunRecords:
        path = Path(run_dir)
        steps = {r["step"]: r for r in _jsonl(path / "metrics.jsonl") if "time/step" in r and "step" in r}
        spans = read_spans(path / "timeline.jsonl") if (path / "timeline.jsonl").is_file() else []
        config = None
        if (path / "resolved_config.yaml").is_file():
            from gyre.config.load import load_config

            try:
                config = load_config(path / "resolved_config.yaml")
            except Exception:  # noqa: BLE001 - a run of another gyre version: what it holds is still read
                config = None
        lengths, note = _prompt_lengths(config)
        groups: dict[int, list[Group]] = {}
        for record in _jsonl(path / "ledger.jsonl"):
            if record.get("trained"):
                groups[record["step"]] = [(lengths.get(g["uid"], -1), tuple(g["lengths"])) for g in record["trained"]]
        return cls(path, steps, spans, groups, config, note)

    def lanes(self, phases: Sequence[str], roles: Sequence[str]) -> dict[int, dict[tuple[str, int], float]]:
        """Seconds spent in ``phases`` per step, per (role, rank) lane of ``roles``."""
        out: dict[int, dict[tuple[str, int], float]] = defaultdict(lambda: defaultdict(float))
        for s in self.spans:
            if s.phase in phases and s.role in roles:
                out[s.step][(s.role, s.rank)] += s.end - s.start
        return out

    def count(self, phases: Sequence[str], roles: Sequence[str], steps: Sequence[int]) -> int:
        chosen = set(steps)
        return sum(1 for s in self.spans if s.phase in phases and s.role in roles and s.step in chosen)


def _jsonl(path: Path) -> list[dict]:
    """A run file's records (none when it is missing; a cut or foreign line is skipped)."""
    return read_jsonl_tolerant(path) if path.is_file() else []


def _prompt_lengths(config) -> tuple[dict[str, int], str]:
    """uid -> prompt tokens of the run's training prompts, tokenised as the run did; or why not."""
    if config is None:
        return {}, "no resolved_config.yaml that loads"
    from gyre.data.columns import ColumnMap
    from gyre.data.prompts import load_prompts
    from gyre.models.loading import load_tokenizer
    from gyre.training.run_data import data_renderer

    d = config.data
    try:
        tokenizer = load_tokenizer(config.model.tokenizer_path or config.model.path, config.model.trust_remote_code)
        records, _ = load_prompts(d.train_files, data_renderer(config, tokenizer), d.max_prompt_tokens,
                                  ColumnMap.from_config(d), d.overlong_prompts)
    except Exception as exc:  # noqa: BLE001 - data or tokenizer not on this machine: said, not fatal
        return {}, f"the run's data or tokenizer did not load here ({type(exc).__name__}: {exc})"
    return {p.uid: len(p.prompt_ids) for p in records}, ""


# ---- the fits -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DecodeFit:
    """An engine's decoding in the run, one of three ways (``mode``): ``two terms``, seconds per decoding
    step and per token prefilled or decoded; ``scale``, the base class's cost of the same samples times
    ``scale``; ``throughput``, seconds per token alone."""

    mode: str
    steps: int
    """RL steps fitted over."""
    spans: int
    engines: int
    per_step_s: float = 0.0
    per_token_s: float = 0.0
    scale: float = 1.0
    residual_pct: float = 0.0
    why: str = ""
    """Why not two terms."""


def _samples(groups: list[Group]) -> list[tuple[int, int]]:
    """(prompt tokens, response tokens) of every sample (an unknown prompt counts 0 tokens)."""
    return [(max(p, 0), r) for p, rs in groups for r in rs]


def decode_features(groups: list[Group], engines: int) -> list[float]:
    """[decoding steps, tokens prefilled and decoded per engine] of a synchronous step's samples."""
    samples = _samples(groups)
    return [max(r for _, r in samples), sum(p + r for p, r in samples) / engines]


def base_decode_s(groups: list[Group], engines: int, cost: CostModel) -> float:
    """What ``cost``'s engine spends on a synchronous step's samples, each engine a 1/``engines`` share of them:
    their prompts' prefill, then every decoding step over the rows still running (finished rows leave)."""
    samples = sorted(_samples(groups), key=lambda s: s[1])
    widest = max(p for p, _ in samples)
    prompts, alive, i = sum(p for p, _ in samples), len(samples), 0
    total = cost.prefill_s(prompts / engines)
    for t in range(1, samples[-1][1] + 1):
        while samples[i][1] < t:  # rows that finished before step t leave the batch
            alive, prompts, i = alive - 1, prompts - samples[i][0], i + 1
        context = alive * (widest + t) if cost.engine.padded_kv else prompts + alive * t
        total += cost.decode_step_s(alive / engines, context / engines)
    return total


def relative_errors(xs: Sequence[Sequence[float]], ys: Sequence[float], coef: Sequence[float]) -> list[float]:
    """Each coefficient's standard error over its value (inf where the points cannot tell it)."""
    n, k = len(ys), len(coef)
    if n <= k or min(coef) <= 0:
        return [math.inf] * k
    sse = sum((sum(c * x for c, x in zip(coef, row)) - y) ** 2 for row, y in zip(xs, ys))
    gram = [[sum(r[i] * r[j] for r in xs) for j in range(k)] for i in range(k)]
    inverse = [_solve_square(gram, [float(i == j) for i in range(k)]) for j in range(k)]
    if any(col is None for col in inverse):
        return [math.inf] * k
    return [math.sqrt(max(0.0, sse / (n - k) * inverse[j][j])) / coef[j] for j in range(k)]


def fit_decode(run: RunRecords, sync: bool, cost: CostModel) -> DecodeFit | str:
    """Decoding costs from the generate spans (module docstring; ``cost``: the base class's engine, whose
    shape a run that cannot tell its two terms apart is scaled to); a reason when they cannot be fitted."""
    busy = run.lanes(("generate",), ENGINE_ROLES)
    engines = len({lane for per in busy.values() for lane in per})
    used = [s for s in sorted(busy) if s >= 2 and run.groups.get(s)]
    if not engines or not used:
        return "no generate spans with trained groups past step 1 (timeline.jsonl, ledger.jsonl)"
    spans = run.count(("generate",), ENGINE_ROLES, used)
    if not sync:  # every engine's seconds over the tokens generated and the prompts admitted
        mean_p = statistics.mean(p for s in used for p, _ in _samples(run.groups[s]))
        tokens = sum(run.steps.get(s, {}).get("rollout/tokens_generated", sum(r for _, r in _samples(run.groups[s])))
                     + run.steps.get(s, {}).get("rollout/groups_admitted", len(run.groups[s]))
                     * len(run.groups[s][0][1]) * mean_p for s in used)
        seconds = sum(sum(busy[s].values()) for s in used)
        return DecodeFit("throughput", len(used), spans, engines, per_token_s=seconds / tokens,
                         why="an asynchronous run's spans mix steps: a per-step cost not separable")
    xs = [decode_features(run.groups[s], engines) for s in used]
    ys = [max(busy[s].values()) for s in used]
    coef, res = nonneg_lstsq(xs, ys)
    errors = relative_errors(xs, ys, coef)
    if max(errors) <= DETERMINED:
        return DecodeFit("two terms", len(used), spans, engines, coef[0], coef[1], residual_pct=res)
    (k,), res = nonneg_lstsq([[base_decode_s(run.groups[s], engines, cost)] for s in used], ys)
    return DecodeFit("scale", len(used), spans, engines, scale=k, residual_pct=res,
                     why=f"a step's and a token's costs not told apart (standard errors "
                         f"{', '.join(f'{e:.0%}' for e in errors)} of a two-term fit)")


def decode_figures(fit: DecodeFit, base: DeviceClass, shape: ModelShape, backend: str) -> dict:
    """The device class's decoding figures that make ``backend``'s engine cost what ``fit`` measured, the
    engine class's scales divided out (``gyre.sim.cost``: overhead + launches + weights and KV / bandwidth +
    rows x 2 P / FLOP/s). Two terms or a throughput: an additive step whose reading costs nothing (the
    per-token term holds it); a scale: the base class's figures, its speeds divided by it."""
    e = engine_class(backend, base)
    launch = e.layer_launch_s * shape.layers
    if fit.mode == "scale":
        k = fit.scale
        fixed = k * (base.step_overhead_s * e.overhead_scale + launch) - launch
        return {"peak_tflops": base.peak_tflops / k, "mem_gbps": base.mem_gbps / k,
                "step_overhead_s": max(0.0, fixed / e.overhead_scale)}
    peak = 2 * shape.params / (fit.per_token_s * e.compute_scale) / 1e12 if fit.per_token_s > 0 else 1e9
    fixed = fit.per_step_s - shape.weight_bytes / (FAST_BANDWIDTH_GBPS * 1e9 * e.mem_scale) - launch
    return {"peak_tflops": peak, "mem_gbps": FAST_BANDWIDTH_GBPS, "compute_eff": 1.0, "mem_eff": 1.0,
            "additive": True, "step_overhead_s": max(0.0, fixed / e.overhead_scale)}


@dataclass(frozen=True)
class TrainFit:
    """The trainer's side of a step: busy seconds = overhead + FLOPs / flops_per_s (train and log-prob spans),
    and the step's rest (``extra_s``: what the trainer's side spends beyond the FLOPs, the fixed cost)."""

    overhead_s: float
    flops_per_s: float
    extra_s: float
    steps: int
    spans: int
    residual_pct: float
    through_zero: bool = False
    """Every step trained nearly the same FLOPs (``ALIKE``): the rate alone was fitted, no fixed cost."""


def fit_train(run: RunRecords, shape: ModelShape, sync: bool, engine_busy: dict[int, float]) -> TrainFit | str:
    """Training throughput from the trainer lanes' spans against the simulated learner's FLOPs of each step's
    rows, and the trainer side's fixed cost from the step times (module docstring)."""
    if run.config is None:
        return "no resolved_config.yaml that loads (the learner's passes and micro-batches come from it)"
    from gyre.sim.learner import sim_learner

    learner = sim_learner(run.config, len(run.config.policy.devices), shape)
    busy = run.lanes(("train", "logprobs"), TRAINER_ROLES)
    used = [s for s in sorted(busy) if s >= 2 and run.groups.get(s) and s in run.steps]
    if len(used) < 2:
        return "fewer than two steps past the first with train spans and trained groups"
    flops = [learner.step_flops([p + r for p, r in _samples(run.groups[s])], s) for s in used]
    ys = [max(busy[s].values()) for s in used]
    alike = max(flops) - min(flops) < ALIKE * statistics.mean(flops)
    if alike:  # a fixed cost and a throughput cannot be told apart: the FLOPs' mean rate, through zero
        (inverse,), res = nonneg_lstsq([[f] for f in flops], ys)
        overhead = 0.0
    else:
        (overhead, inverse), res = nonneg_lstsq([[1.0, f] for f in flops], ys)
    if inverse <= 0:
        return "the train spans do not grow with the FLOPs trained"
    rest = []
    for s, f in zip(used, flops):
        m = run.steps[s]
        rollout = engine_busy.get(s, m.get("time/generate", 0.0)) if sync else m.get("time/generate", 0.0)
        rest.append(m["time/step"] - rollout - m.get("time/weight_sync", 0.0) - m.get("time/reward", 0.0)
                    - f * inverse)
    return TrainFit(overhead, 1 / inverse, max(0.0, statistics.mean(rest)), len(used),
                    run.count(("train", "logprobs"), TRAINER_ROLES, used), res, alike)


def sync_figures(run: RunRecords, base: DeviceClass, shape: ModelShape) -> tuple[dict, str]:
    """The weight update's figures: call_s from the mean ``time/weight_sync`` less what the run's transport
    moves at the base class's links (scaled down when they alone take longer); and a line saying so."""
    times = [m["time/weight_sync"] for s, m in run.steps.items() if s >= 2 and "time/weight_sync" in m]
    if not times or run.config is None:
        return {}, "weights     not fitted: no time/weight_sync past step 1 (or no resolved config)"
    from gyre.sim.scenario import engine_and_transport, layout

    cfg = run.config
    placed = layout(cfg, len(set(cfg.rollout.devices) | set(cfg.policy.devices)))
    backend, transport = engine_and_transport(cfg, placed, base)
    measured = statistics.mean(times)
    spans = run.count(("weight_sync", "weight_send"), ENGINE_ROLES, [s for s in run.steps if s >= 2])
    moved = CostModel(replace(base, call_s=0.0), shape, cfg.rollout.tensor_parallel_size,
                      engine_class(backend, base), transport).sync_s()
    head = f"weights     {measured * 1e3:.2f} ms a sync (time/weight_sync of {len(times)} steps, {spans} spans; " \
           f"transport {transport})"
    if transport in ("none",) or moved <= 0:
        return {"call_s": measured}, f"{head} -> call_s; links not fitted (the run moved no weights)"
    if moved <= measured:
        return {"call_s": measured - moved}, f"{head} -> call_s, less {moved * 1e3:.2f} ms the base links move"
    k = moved / measured
    links = {f: getattr(base, f) * k for f in ("peer_gbps", "net_gbps", "host_gbps", "tcp_gbps", "pcie_gbps")}
    return {"call_s": 0.0, **links}, f"{head} -> call_s 0, the base class's links x{k:.2f} (they took {moved:.3f} s)"


def fit_rewards(run: RunRecords) -> tuple[float, int] | None:
    """(median seconds, spans) of the reward spans past step 1; None when the run recorded none."""
    spans = [s.end - s.start for s in run.spans if s.phase == "reward" and s.role == "reward" and s.step >= 2]
    return (statistics.median(spans), len(spans)) if spans else None


def fit_prompts(run: RunRecords) -> tuple[float, float, int] | None:
    """(mean tokens, cv, groups) of the trained groups' prompts; None when their lengths are unknown."""
    lengths = [p for groups in run.groups.values() for p, _ in groups if p >= 0]
    if not lengths:
        return None
    mean = statistics.mean(lengths)
    return mean, statistics.pstdev(lengths) / mean, len(lengths)


# ---- the calibration ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Calibration:
    """What a real run says of the machine and the task (``calibrate``), and ``lines`` saying what was fitted
    from how much, and what was not."""

    source: Path
    metrics: Path
    device: DeviceClass | None = None
    """The base class with the fitted figures (None: the device was not fitted)."""
    prompts: tuple[float, float] | None = None
    """(mean tokens, cv)."""
    reward_s: float | None = None
    """A reward call's seconds (the median reward span)."""
    recorded: tuple[tuple[tuple[int | None, tuple[int, ...]], ...], ...] | None = None
    """The trained groups by step, replayed (``RecordedWorkload``)."""
    lines: tuple[str, ...] = ()

    def workload(self, spec: WorkloadSpec, max_tokens: int) -> WorkloadSpec:
        """``spec`` with the response lengths fitted (``fit_lengths``) and the fitted prompts and rewards."""
        spec = fit_lengths(self.metrics, max_tokens, spec)
        if self.prompts is not None:
            spec = replace(spec, prompt_tokens=self.prompts[0], prompt_tokens_cv=self.prompts[1])
        if self.reward_s is not None:
            spec = replace(spec, reward_latency_s=self.reward_s)
        return spec

    def report(self) -> str:
        return "\n".join([f"calibrated from {self.source}:", *(f"  {line}" for line in self.lines)])


def calibrate(path: str | Path, base: DeviceClass, shape: ModelShape) -> Calibration:
    """The calibration of ``path`` (a run directory, or only its metrics.jsonl: response lengths alone) for a
    simulation on ``base`` (``simulate.device``) of a model of ``shape`` (the run's own model is used for the
    fit when its config.json is here). Cached per run and its files' modification times."""
    path = Path(path).resolve()
    files = [path / n for n in ("metrics.jsonl", "timeline.jsonl", "ledger.jsonl")] if path.is_dir() else [path]
    stamp = tuple(f.stat().st_mtime_ns if f.exists() else 0 for f in files)
    return _calibrate(path, stamp, base, shape)


@functools.lru_cache(maxsize=16)
def _calibrate(path: Path, stamp: tuple, base: DeviceClass, shape: ModelShape) -> Calibration:
    lengths = "responses   lognormal lengths fitted to the metrics' mean, max and truncated share (fit_lengths)"
    if not path.is_dir():
        return Calibration(path, path, lines=(lengths, "lengths only (a metrics.jsonl): the device, prompt lengths "
                                                       "and reward latency stay the config's; give the run "
                                                       "directory to fit them"))
    run = RunRecords.read(path)
    lines, figures = [], {}
    cfg = run.config
    if cfg is not None and (Path(cfg.model.path).expanduser() / "config.json").is_file():
        shape = ModelShape.from_hf_config(Path(cfg.model.path).expanduser())
    sync = cfg is None or (cfg.rollout.async_ratio == 0 and cfg.rollout.tail_batching is None)
    backend = "hf" if cfg is None or cfg.rollout.mode == "hybrid" else cfg.rollout.backend
    tp = cfg.rollout.tensor_parallel_size if cfg is not None else 1
    decode = fit_decode(run, sync, CostModel(base, shape, tp, engine_class(backend, base)))
    engine_busy = {}
    if isinstance(decode, DecodeFit):
        figures.update(decode_figures(decode, base, shape, backend))
        lines.append(_decode_line(decode, figures))
        engine_busy = {s: max(per.values()) for s, per in run.lanes(("generate",), ENGINE_ROLES).items()}
    else:
        lines.append(f"decoding    not fitted: {decode}; the base class's figures")
    train = fit_train(run, shape, sync, engine_busy)
    peak = figures.get("peak_tflops", base.peak_tflops)
    if isinstance(train, TrainFit):
        figures.update(train_mfu=train.flops_per_s / (peak * 1e12), train_overhead_s=train.extra_s)
        lines.append(f"training    {train.overhead_s * 1e3:.1f} ms + FLOPs at {train.flops_per_s / 1e9:.3g} GFLOP/s "
                     f"(train/log-prob spans: {train.spans} over {train.steps} steps, |resid| {train.residual_pct:.0f}%"
                     f"{'; every step trained alike FLOPs: the rate alone' if train.through_zero else ''}) -> "
                     f"train_mfu {figures['train_mfu']:.4g}; the trainer side's fixed cost "
                     f"{train.extra_s * 1e3:.1f} ms a step -> train_overhead_s")
    else:  # the base class's training FLOP/s, whatever the decode fit made of its peak
        figures["train_mfu"] = base.train_mfu * base.peak_tflops / peak
        lines.append(f"training    not fitted: {train}; the base class's {base.peak_tflops * base.train_mfu:.3g} "
                     f"TFLOP/s and train_overhead_s")
    sync_fig, sync_line = sync_figures(run, base, shape)
    figures.update(sync_fig)
    lines.append(sync_line)
    device = replace(base, name=f"{base.name}, fitted", **figures) if figures else None
    lines.append(f"device      {device.name if device else base.name}: " + (
        "the fitted figures on the base class (its memory, price and unfitted links kept), additive"
        if device else "nothing fitted"))
    prompts, rewards = fit_prompts(run), fit_rewards(run)
    lines.append(f"prompts     mean {prompts[0]:.1f} tokens, cv {prompts[1]:.2f} ({prompts[2]} trained groups' prompts)"
                 if prompts else f"prompts     not fitted ({run.prompt_note or 'no ledger.jsonl'}): the config's")
    lines.append(f"rewards     {rewards[0] * 1e3:.2f} ms a call (the median of {rewards[1]} reward spans); its "
                 f"spread not fitted (a span is a call or a busy interval, not a sample's wait): the config's cv"
                 if rewards else "rewards     latency not fitted (no reward spans past step 1): the config's")
    recorded = replayed_groups(run)
    lines.append(lengths + (f"; {sum(len(g) for g in recorded)} trained groups of {len(recorded)} steps replayed"
                            if recorded else ""))
    return Calibration(path, path / "metrics.jsonl", device, prompts[:2] if prompts else None,
                       rewards[0] if rewards else None, recorded, tuple(lines))


def _decode_line(fit: DecodeFit, figures: dict) -> str:
    source = f"generate spans: {fit.spans} of {fit.engines} engine(s) over {fit.steps} steps"
    result = (f"step_overhead_s {figures['step_overhead_s']:.4g}, peak_tflops {figures['peak_tflops']:.4g}, "
              f"mem_gbps {figures['mem_gbps']:.4g}")
    if fit.mode == "throughput":
        return (f"decoding    {fit.per_token_s * 1e6:.1f} us a token prefilled or decoded ({source}; {fit.why}) "
                f"-> {result}")
    if fit.mode == "scale":
        return (f"decoding    {fit.scale:.3g}x the base class's seconds for the same samples ({source}, |resid| "
                f"{fit.residual_pct:.0f}%; {fit.why}: the base class's shape kept) -> {result}")
    return (f"decoding    {fit.per_step_s * 1e3:.3f} ms a step + {fit.per_token_s * 1e6:.2f} us a token prefilled "
            f"or decoded ({source}, |resid| {fit.residual_pct:.0f}%; the KV read per context token not separable "
            f"from one run: in the per-token cost) -> {result}")


def replayed_groups(run: RunRecords):
    """The ledger's trained groups by step (whole groups, always), prompt tokens None where unknown; else
    the generation files' (``recorded_groups``)."""
    steps = [[(p if p >= 0 else None, rs) for p, rs in run.groups[s]] for s in sorted(run.groups)]
    sizes = {len(rs) for groups in steps for _, rs in groups}
    if steps and len(sizes) == 1:
        return tuple(tuple(groups) for groups in steps)
    groups = recorded_groups(run.path)
    return tuple(tuple(step) for step in groups) if groups else None
