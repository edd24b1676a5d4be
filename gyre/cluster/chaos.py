"""Fault injection for drills and tests: find a run's role processes and kill or stop them.

A run started by ``gyre train`` owns a private Ray whose processes all descend from the driver, and Ray
names each actor's process after its class (``ray::PolicyWorker``, ``ray::PolicyWorker.train``...).
``role_processes`` maps role names to those pids; reward subprocesses are the children a
``RewardWorker`` spawns. ``inject`` applies one fault: SIGKILL, or SIGSTOP (never continued: the run
must notice the stall and replace the worker). Used by ``tests/pipelines/test_fault_injection.py`` and
``bench/fault_injection.py``.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

ROLE_CLASSES = {"policy": "PolicyWorker", "rollout": "RolloutWorker", "reference": "ReferenceWorker",
                "critic": "CriticWorker", "reward": "RewardWorker"}
Target = Literal["policy", "rollout", "reference", "critic", "reward", "reward_subprocess", "driver"]
Action = Literal["kill", "stop"]


@dataclass(frozen=True)
class Fault:
    target: Target
    action: Action

    def __str__(self) -> str:
        return f"{self.action} {self.target}"


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] not in ("Z", "X"):
            out.setdefault(int(fields[1]), []).append(int(entry))
    return out


def _descendants(root: int) -> list[int]:
    children = _children()
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            found.append(child)
            todo.append(child)
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


def role_processes(driver: int) -> dict[str, list[int]]:
    """Live, running (not stopped) processes of each role of the run whose driver is ``driver``."""
    out: dict[str, list[int]] = {role: [] for role in (*ROLE_CLASSES, "reward_subprocess")}
    pids = [p for p in _descendants(driver) if _state(p) not in ("T", "t", "Z", "X")]
    titles = {pid: _cmdline(pid) for pid in pids}
    for pid, title in titles.items():
        for role, cls in ROLE_CLASSES.items():
            if title.startswith(f"ray::{cls}"):
                out[role].append(pid)
    children = _children()
    for worker in out["reward"]:
        # the runner's spawned children, not multiprocessing's resource tracker
        out["reward_subprocess"] += [c for c in children.get(worker, []) if "spawn_main" in titles.get(c, "")]
    return out


def inject(fault: Fault, driver: int, rng: random.Random) -> int | None:
    """Apply ``fault`` to one process of its target (chosen with ``rng``); returns its pid, or None when
    the target has no live process right now (e.g. between a death and the restart)."""
    if fault.target == "driver":
        pid = driver
    else:
        candidates = sorted(role_processes(driver)[fault.target])
        if not candidates:
            return None
        pid = rng.choice(candidates)
    try:
        os.kill(pid, signal.SIGKILL if fault.action == "kill" else signal.SIGSTOP)
    except ProcessLookupError:
        return None
    return pid


def plan_faults(count: int, seed: int, targets: tuple[Target, ...] = ("policy", "rollout", "reference", "reward",
                                                                       "reward_subprocess", "driver")) -> list[Fault]:
    """``count`` faults cycling over ``targets`` (each target kill and stop in turn), shuffled by ``seed``."""
    kinds = [Fault(t, a) for t in targets for a in (("kill",) if t == "driver" else ("kill", "stop"))]
    faults = [kinds[i % len(kinds)] for i in range(count)]
    random.Random(seed).shuffle(faults)
    return faults


# ---- drills: a run under faults, compared with an uninterrupted one -----------------------------------

_VOLATILE = ("time", "time/", "idle/", "reward/latency", "/reward_latency", "fault/", "rollout/in_flight_groups",
             "rollout/buffer_groups", "rollout/samples_requeued", "rollout/tokens_generated", "rollout/tokens_wasted")
"""Metric keys that measure time or count faults: they differ between a faulted run and a straight one
(with asynchrony, how far the rollout ran ahead when a batch was taken is a matter of timing too; samples
are requeued only when an engine is lost while it owes them, and come out the same when regenerated).
Tokens generated and wasted count what this process generated: a lost engine's partial samples are
generated again, and a resumed run does not generate the groups its checkpoint gave back. What trained
(rollout/tokens_trained and every training metric) must still match."""


def _comparable(record: dict) -> dict:
    return {k: v for k, v in record.items() if not any(k == p or k.startswith(p) or k.endswith(p) for p in _VOLATILE)}


def read_stream(run_dir) -> list[dict]:
    """The metric stream of a run (metrics.jsonl), without the keys that measure time or faults."""
    import json
    from pathlib import Path

    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [_comparable(json.loads(line)) for line in lines if line.strip()]


def compare_runs(straight, faulted, rtol: float = 1e-6, weights_atol: float = 0.0) -> list[str]:
    """Differences between two runs' metric streams and final weights (empty: they are the same run)."""
    import math
    from pathlib import Path

    a, b = read_stream(straight), read_stream(faulted)
    problems = []
    if [r["step"] for r in a] != [r["step"] for r in b]:
        problems.append(f"steps differ: {[r['step'] for r in a]} vs {[r['step'] for r in b]}")
    for ra, rb in zip(a, b):
        for key in sorted(set(ra) | set(rb)):
            va, vb = ra.get(key), rb.get(key)
            same = va == vb or (isinstance(va, float) and isinstance(vb, float)
                                and math.isclose(va, vb, rel_tol=rtol, abs_tol=rtol))
            if not same:
                problems.append(f"step {ra.get('step')} {key}: {va} vs {vb}")
    problems += _compare_weights(Path(straight) / "final_model", Path(faulted) / "final_model", weights_atol)
    return problems


def _compare_weights(a, b, atol: float) -> list[str]:
    import torch
    from safetensors.torch import load_file

    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    if wa.keys() != wb.keys():
        return ["final weights have different tensors"]
    return [f"final weight {k} differs by {float((wa[k] - wb[k]).abs().max()):.3g}" for k in wa
            if not torch.allclose(wa[k], wb[k], atol=atol, rtol=0.0)]


@dataclass
class DrillReport:
    injected: list[tuple[float, str, int]] = field(default_factory=list)
    """(seconds since start, fault, pid) of every fault applied."""
    schedule: list[int] = field(default_factory=list)
    """The logged step each fault waited for (``fault_steps``)."""
    struck_after: list[int] = field(default_factory=list)
    """The newest step the run had logged when each fault struck."""
    driver_starts: int = 0
    seconds: float = 0.0
    log: Path | None = None


def fault_steps(count: int, steps: int, seed: int) -> list[int]:
    """The step after whose record each of ``count`` faults strikes: one draw (from ``seed``) in each of
    ``count`` equal shares of steps 1 .. steps - 2, ascending, so the faults spread over the whole run.
    A fault strikes before the next step is logged at the latest, so the last still finds a step to run."""
    last = max(1, steps - 2)
    rng = random.Random(f"fault steps {seed}")  # draws of their own, apart from the drill's timing and targets
    return [rng.randint(1 + i * last // count, max(1 + i * last // count, (i + 1) * last // count))
            for i in range(count)]


def _start(config: Path, log, resume: bool) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "gyre.app.cli", "train", str(config), *(["--resume", "auto"] if resume else [])]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _end_session(proc: subprocess.Popen) -> None:
    """After the driver was killed: whatever it started (its private Ray) goes too."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _last_record(metrics: Path) -> dict:
    """The newest record of the run's metrics ({} when there is none, or it is being written)."""
    import json

    try:
        lines = metrics.read_text().splitlines()
        record = json.loads(lines[-1]) if lines else {}
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def run_drill(config: Path, faults: list[Fault], seed: int, timeout_s: float = 1800.0,
              log_path: Path | None = None) -> DrillReport:
    """Run ``gyre train config`` and apply ``faults`` one by one, each on an event of the run rather than
    after a wall-clock gap (which a fast run outlives): fault i waits until the run has logged step
    ``fault_steps(...)[i]`` or later since the previous fault (so it lands in a running run, not a
    restarting one), then strikes a random fraction (from ``seed``) of that step's duration later, or as
    soon as the next step is logged, whichever comes first: somewhere in the next step on any machine.
    A killed driver is restarted with ``--resume auto``. Returns when the run has finished; raises
    RuntimeError when it fails or overruns ``timeout_s``."""
    import yaml

    cfg = yaml.safe_load(Path(config).read_text())["run"]
    metrics = Path(cfg["output_dir"]) / "metrics.jsonl"
    rng = random.Random(seed)
    queue = list(faults)
    report = DrillReport(schedule=fault_steps(len(faults), int(cfg["steps"]), seed),
                         log=log_path or Path(config).with_suffix(".drill.log"))
    start = time.monotonic()
    last_fault_wall = time.time()
    due = armed_step = None
    with open(report.log, "w") as log:
        proc = _start(config, log, resume=False)
        report.driver_starts = 1
        try:
            while proc.poll() is None or proc.returncode != 0:
                now = time.monotonic()
                if now - start > timeout_s:
                    raise RuntimeError(f"the drill overran {timeout_s:.0f} s; see {report.log}")
                if proc.poll() is not None:
                    raise RuntimeError(f"the run failed (exit {proc.returncode}); see {report.log}")
                record = _last_record(metrics) if queue else {}
                # Logged since the previous fault, by the RL loop (SFT warm-up records number their own steps).
                fresh = record.get("time", 0.0) > last_fault_wall and record.get("phase", "train") == "train"
                step = record.get("step", -1) if fresh else -1
                if queue and due is None and step >= report.schedule[len(report.injected)]:
                    armed_step = step  # the run is stepping past the fault's step: strike in the next one
                    due = now + rng.random() * float(record.get("time/step", 0.0))
                if queue and due is not None and (now >= due or step > armed_step):
                    pid = inject(queue[0], proc.pid, rng)
                    if pid is None:  # nothing to hit right now: try again shortly
                        time.sleep(0.2)
                        continue
                    report.injected.append((round(now - start, 1), str(queue.pop(0)), pid))
                    report.struck_after.append(max(step, armed_step))
                    last_fault_wall, due = time.time(), None
                    if pid == proc.pid:
                        proc.wait()
                        _end_session(proc)
                        proc = _start(config, log, resume=True)
                        report.driver_starts += 1
                time.sleep(0.05)
        finally:
            if proc.poll() is None:
                _end_session(proc)
    report.seconds = time.monotonic() - start
    return report
