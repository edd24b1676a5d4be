"""The GPU smoke check's sections that check other parts: the tests CI skips, and the memory pre-flight."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from gpusmoke.common import Ctx, gib


def _names_a_gpu(source: str) -> bool:
    return "cuda" in source or "GPU" in source


def gpu_test_ids(root: Path) -> list[str]:
    """pytest node ids of the tests CI skips for want of a GPU: test functions with a ``skipif`` decorator that
    names CUDA or a GPU, or that use such a marker defined in their module (``TWO_GPUS = pytest.mark.skipif(...)``,
    given to some of their parameters)."""
    ids = []
    for path in sorted((root / "tests").rglob("test_*.py")):
        text = path.read_text()
        if "skipif" not in text or not _names_a_gpu(text):
            continue
        tree = ast.parse(text)
        marks = {target.id for node in tree.body if isinstance(node, ast.Assign)
                 for target in node.targets if isinstance(target, ast.Name)
                 and "skipif" in (source := ast.get_source_segment(text, node.value) or "") and _names_a_gpu(source)}
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                for decorator in node.decorator_list:
                    source = ast.get_source_segment(text, decorator) or ""
                    used = {n.id for n in ast.walk(decorator) if isinstance(n, ast.Name)}
                    if ("skipif" in source and _names_a_gpu(source)) or used & marks:
                        ids.append(f"{path.relative_to(root).as_posix()}::{node.name}")
                        break
    return ids


def junit_outcomes(path: Path) -> list[dict]:
    """Each test case of a pytest JUnit XML report: its id, outcome, seconds and, unless it passed, why."""
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                message = (child.get("message") or child.text or "")[:600]
                break
        cases.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                      "seconds": round(float(case.get("time") or 0), 2), **({"why": message} if message else {})})
    return cases


def gpu_tests(ctx: Ctx) -> dict:
    """Run the tests that skip without a GPU (their CPU variants run in CI already: deselected here), with a
    deadline inside the section's time box; pass/fail/skip counts and each test's outcome."""
    ids = gpu_test_ids(ctx.root)
    xml = ctx.work / "gpu_tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", "-k", "not cpu",
           f"--junitxml={xml}", *ids]
    deadline = max(10.0, ctx.budget_s - 15)
    start = time.monotonic()
    # A session of its own: at the deadline the whole tree goes (a GPU run's `gyre train` starts Ray).
    proc = subprocess.Popen(cmd, cwd=ctx.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate(timeout=30)
        return {"ok": False, "error": f"pytest passed its {deadline:.0f} s deadline", "tests": ids,
                "output_tail": output[-3000:]}
    cases = junit_outcomes(xml) if xml.is_file() else []
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "error", "skipped")}
    ok = proc.returncode in (0, 5) and not counts["failed"] and not counts["error"]  # 5: nothing ran
    counts = {f"{k}_count": n for k, n in counts.items()}
    result = {"ok": ok, "exit_code": proc.returncode, "seconds": round(time.monotonic() - start, 1), **counts,
              "cases": cases}
    if not ok:
        result["output_tail"] = output[-3000:]
    result["headline"] = ", ".join(f"{n} {k.removesuffix('_count')}" for k, n in counts.items() if n) or "no tests"
    return result


# ---- f. the memory pre-flight against measured peaks -------------------------------------------------------
_BASE = ["data.train_files=[t.jsonl]", "model.dtype=bfloat16", "policy.devices=[0]", "rollout.devices=[1]",
         "rollout.weight_transport=object_store"]
"""Policy and engine on devices of their own (no sums, no offload), no channel staging: what was measured."""


def _estimate(overrides: list[str], shape, role: str):
    from gyre.config import load_config, make_plan
    from gyre.config.memory import estimate

    cfg = load_config(None, _BASE + overrides)
    memory = estimate(cfg, make_plan(cfg, "cuda", 2), shape, None)
    return next(r for r in memory.roles if r.role == role)


def _compare(role, measured_gib: float | None) -> dict:
    out = {"estimate_gib": gib(role.total), "estimate_bytes": int(role.total),
           "terms_gib": {k: gib(v) for k, v in role.terms.items()}, "measured_peak_gib": measured_gib}
    if measured_gib:
        out["estimate_over_measured"] = round(role.total / 2**30 / measured_gib, 3)
    return out


def preflight(ctx: Ctx) -> dict:
    """``gyre check``'s memory estimate (gyre.config.memory) of the trainer step the offload section ran and of
    the engine batches the 7B section decoded, against the peaks they measured (torch's max allocated: the
    estimate's HEADROOM covers the CUDA context and allocator slack on top)."""
    from gyre.config.catalog import ModelShape

    out = {}
    trained = ctx.prior.get("offload", {}).get("result", {})
    if "workload" in trained:
        w = trained["workload"]
        shape = ModelShape.from_hf_config(ctx.mid)
        for strategy in ("ddp", "fsdp2"):
            role = _estimate([f"model.path={ctx.mid}", f"policy.strategy={strategy}",
                              f"policy.micro_batch_size={w['rows']}", f"data.max_prompt_tokens={w['prompt_tokens']}",
                              f"rollout.sampling.max_new_tokens={w['response_tokens']}"], shape, "policy")
            out[f"trainer step ({strategy}, one rank)"] = _compare(role, trained.get(strategy, {}).get("peak_gib"))
    engine = ctx.prior.get("engine_7b", {}).get("result", {})
    if "workload" in engine:
        w = engine["workload"]
        shape = ModelShape.from_hf_config(ctx.work / "qwen2.json", engine["shape"])
        for rows in w["batches"]:
            role = _estimate(["model.path=m", f"rollout.max_batch_size={rows}",
                              f"data.max_prompt_tokens={w['prompt_tokens']}",
                              f"rollout.sampling.max_new_tokens={w['new_tokens']}"], shape, "rollout")
            out[f"engine, batch {rows}"] = _compare(role, engine.get(f"batch {rows}", {}).get("peak_gib"))
    if not out:
        return {"skipped": "the offload and 7B engine sections left no measurements"}
    ratios = [f"{k}: {v['estimate_over_measured']}" for k, v in out.items() if "estimate_over_measured" in v]
    out["headline"] = "estimate / measured peak: " + "; ".join(ratios) if ratios else "estimates only (no CUDA)"
    return out
