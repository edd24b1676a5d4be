"""The text sections of a run report: sample generations, the run's facts, its config and validation table.

Everything shown comes from files of the run directory, and generations hold untrusted text (the
model's outputs, the prompts of a data set): every value is HTML-escaped here, and the page's script
only shows and hides what was rendered, never builds markup from data.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

from gyre.tracking.logger import read_jsonl_tolerant

MAX_ROWS_PER_FILE = 64
"""Generations shown per step file (the files hold a sample already)."""
MAX_TRAIN_FILES = 20
MAX_VAL_FILES = 10
"""The page embeds the last this many train and validation step files (the page stays small in a long run)."""
MAX_TEXT_CHARS = 20_000
"""Longer prompts or responses are cut here (and say so)."""
_STEP_FILE = re.compile(r"(val_)?step_(\d+)\.jsonl")


def esc(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _text(value) -> str:
    text = "" if value is None else str(value)
    if len(text) > MAX_TEXT_CHARS:
        text = text[:MAX_TEXT_CHARS] + f"\n[... {len(text) - MAX_TEXT_CHARS} more characters]"
    return f"<pre>{esc(text)}</pre>"


def _number(value, fmt: str = "{:.3f}") -> str:
    return fmt.format(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else esc(value)


def generation_files(run_dir: Path) -> list[tuple[str, int, Path]]:
    """(split, step, path) of every generations/[val_]step_N.jsonl, by step, train before validation."""
    found = []
    for path in (run_dir / "generations").glob("*.jsonl"):
        m = _STEP_FILE.fullmatch(path.name)
        if m:
            found.append(("val" if m.group(1) else "train", int(m.group(2)), path))
    return sorted(found, key=lambda f: (f[1], f[0] != "train"))


def shown_generation_files(files: list[tuple[str, int, Path]]) -> list[tuple[str, int, Path]]:
    """The last MAX_TRAIN_FILES train and MAX_VAL_FILES validation files of ``files``, in their order."""
    keep = {id(f) for split, limit in (("train", MAX_TRAIN_FILES), ("val", MAX_VAL_FILES))
            for f in [f for f in files if f[0] == split][-limit:]}
    return [f for f in files if id(f) in keep]


def _turns(turns) -> str:
    if not isinstance(turns, list):
        return ""
    items = []
    for t in turns:
        t = t if isinstance(t, dict) else {"text": t}
        reward = f" (reward {_number(t.get('reward'))})" if t.get("reward") is not None else ""
        items.append(f"<li><b>{esc(t.get('role'))}</b>{reward}{_text(t.get('text'))}</li>")
    return f"<details><summary>{len(items)} turns</summary><ol class='turns'>{''.join(items)}</ol></details>"


def _card(row: dict) -> str:
    facts = [("group", esc(row.get("group"))), ("sample", esc(row.get("sample"))), ("domain", esc(row.get("domain"))),
             ("reward", _number(row.get("reward"))), ("correct", esc(row.get("correct", row.get("passed")))),
             ("advantage", _number(row.get("advantage"))), ("weight version", esc(row.get("weight_version"))),
             ("finish", esc(row.get("finish_reason"))), ("tokens", esc(row.get("response_tokens")))]
    head = "".join(f"<span class='fact'>{name}: <b>{value}</b></span>" for name, value in facts)
    return (f"<div class='card'><div class='facts'>{head}</div><div class='label'>prompt</div>"
            f"{_text(row.get('prompt'))}<div class='label'>response</div>{_text(row.get('response'))}"
            f"{_turns(row.get('turns'))}</div>")


def generations_section(run_dir: Path) -> str:
    """A step selector and, per step file, its generations as cards (only the selected step is shown)."""
    every = generation_files(run_dir)
    if not every:
        return ("<p class='note'>No generations were written for this run (<code>generations/</code> is absent: "
                "set <code>logging.generations_every</code>).</p>")
    files = shown_generation_files(every)
    options, blocks = [], []
    for i, (split, step, path) in enumerate(files):
        key = f"{split}-{step}"
        rows = read_jsonl_tolerant(path, MAX_ROWS_PER_FILE)
        label = f"{'validation' if split == 'val' else 'train'} step {step} ({len(rows)} samples)"
        options.append(f"<option value='{esc(key)}'{' selected' if i == len(files) - 1 else ''}>{esc(label)}</option>")
        cards = "".join(_card(r) for r in rows) or "<p class='note'>This file holds no generations.</p>"
        hidden = "" if i == len(files) - 1 else " hidden"
        blocks.append(f"<div class='gen-step' data-step='{esc(key)}'{hidden}>{cards}</div>")
    note = (f"<p class='note'>Showing the last {MAX_TRAIN_FILES} train and {MAX_VAL_FILES} validation steps of "
            f"the {len(every)} files in <code>generations/</code>.</p>" if len(files) < len(every) else "")
    return (f"{note}<label>Step: <select id='gen-select'>{''.join(options)}</select></label>{''.join(blocks)}"
            "<script>(function(){var s=document.getElementById('gen-select');function show(){"
            "document.querySelectorAll('.gen-step').forEach(function(d){d.hidden=d.dataset.step!==s.value;});}"
            "s.addEventListener('change',show);show();})();</script>")


def run_section(run_dir: Path) -> str:
    """Versions, git commit, start time and the placement plan, from run_info.json."""
    path = run_dir / "run_info.json"
    if not path.exists():
        return "<p class='note'>run_info.json is absent (a run started before gyre wrote it).</p>"
    try:
        info = json.loads(path.read_text())
    except json.JSONDecodeError:
        return "<p class='note'>run_info.json is not valid JSON.</p>"
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(info.get(k))}</td></tr>"
                   for k in ("gyre", "torch", "transformers", "ray", "python", "git_commit", "started"))
    restarts = info.get("sessions") if isinstance(info.get("sessions"), list) else []
    if restarts:  # a resumed or recovered run: when each later start was, with which software
        rows += "".join(f"<tr><th>restarted</th><td>{esc(r.get('started'))} (gyre "
                        f"{esc((r.get('versions') or {}).get('gyre'))}, commit {esc(r.get('git_commit'))})</td></tr>"
                        for r in restarts if isinstance(r, dict))
    placement = info.get("placement")
    if not isinstance(placement, str):
        placement = json.dumps(placement, indent=2)
    return f"<table class='data' id='versions'>{rows}</table><h3>Placement plan</h3>{_text(placement)}"


def config_section(run_dir: Path) -> str:
    path = run_dir / "resolved_config.yaml"
    if not path.exists():
        return "<p class='note'>resolved_config.yaml is absent.</p>"
    return f"<details open><summary>resolved_config.yaml</summary>{_text(path.read_text(errors='replace'))}</details>"


def validation_section(run_dir: Path) -> str:
    """validation.md's Markdown table as an HTML table."""
    path = run_dir / "validation.md"
    if not path.exists():
        return ("<p class='note'>No validation table (validation.md is absent: validation.every is 0, or none ran "
                "yet).</p>")
    rows = [line.strip().strip("|").split("|") for line in path.read_text(errors="replace").splitlines()
            if line.strip().startswith("|") and not set(line.strip()) <= set("|-: ")]
    if not rows:
        return "<p class='note'>validation.md holds no rows yet.</p>"
    head = "".join(f"<th>{esc(c.strip())}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{esc(c.strip())}</td>" for c in r) + "</tr>" for r in rows[1:])
    return f"<table class='data' id='validation-table'><tr>{head}</tr>{body}</table>"


HEADLINES = (("held-out accuracy", "val/accuracy", "{:.1%}"), ("held-out reward", "val/reward/mean", "{:.3f}"),
             ("train reward", "reward/mean", "{:.3f}"), ("train accuracy", "accuracy", "{:.1%}"),
             ("SFT loss", "sft_loss", "{:.4f}"), ("DPO loss", "dpo_loss", "{:.4f}"),
             ("DPO preference accuracy", "rewards/accuracies", "{:.1%}"))
"""(label, metric key, format) of the figures the summary gives first -> last, when the run logged them."""


def summary_section(run_dir: Path) -> str:
    """The run at a glance: whether it finished, its steps and wall time, and its headline metrics from their
    first to their last value (all from metrics.jsonl and the run directory)."""
    path = run_dir / "metrics.jsonl"
    records = [r for r in read_jsonl_tolerant(path) if isinstance(r, dict)] if path.exists() else []
    done = (run_dir / "final_model").is_dir()
    rows = [("status", "finished: final_model/ written" if done else
             "no final model yet: running, stopped or failed (driver.log says which)")]
    steps = [r["step"] for r in records if isinstance(r.get("step"), int)]
    if steps:
        phases = sorted({str(r.get("phase", "train")) for r in records})
        rows.append(("steps", f"{max(steps)} ({', '.join(phases)})"))
    times = [r["time"] for r in records if isinstance(r.get("time"), (int, float))]
    if len(times) > 1:
        rows.append(("wall time", f"{(max(times) - min(times)) / 60:.1f} min"))
    for label, key, fmt in HEADLINES:
        values = [r[key] for r in records if isinstance(r.get(key), (int, float)) and not isinstance(r[key], bool)]
        if values:
            rows.append((label, f"{fmt.format(values[0])} → {fmt.format(values[-1])}" if len(values) > 1
                         else fmt.format(values[0])))
    errors = sum(r.get("reward/errors", 0) for r in records if isinstance(r.get("reward/errors"), (int, float)))
    if errors:
        rows.append(("reward errors", f"{errors:g} (scored 0; see the Generations section and driver.log)"))
    body = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
    return f"<table class='data' id='summary'>{body}</table>"
