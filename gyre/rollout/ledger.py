"""The trained-sample ledger: what became of every prompt drawn from the data order (``ledger.jsonl``).

Each training step writes one line: the prompts it drew from the data order, admitted again (an expired
group's prompt, a checkpoint's, tail batching's long queue), saw expire, cut to the long queue or
drop (with why: redundant, filtered, failed, or expired under ``rollout.expired: drop``), and the
groups it trained: prompt uid, group id, the policy versions that generated them, each sample's reward
and response length. A checkpoint, and the run's end, add a line with the prompts still pending (drawn,
neither trained nor dropped). ``--resume`` truncates the lines after its checkpoint, as it does
``metrics.jsonl``, and goes on.

``audit`` checks a ledger from its lines alone: every prompt drawn is trained, dropped or pending, once
per draw. Sans-IO: the scheduler records events, the logger writes the lines.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

EVENTS = ("drawn", "readmitted", "expired", "requeued", "cut", "dropped", "trained")


def step_line(step: int, events: dict[str, list]) -> dict:
    """The ledger line of step ``step``, from the scheduler's events (``RolloutScheduler.take_ledger``)."""
    return {"step": step, **{k: events[k] for k in EVENTS if events.get(k)}}


def pending_line(step: int, pending: list[str]) -> dict:
    return {"step": step, "pending": list(pending)}


def audit(lines: Iterable[dict]) -> list[str]:
    """What the ledger fails to account for: a prompt drawn more often than it was trained, dropped or is
    pending, or the reverse. The last ``pending`` line closes the books; lines after it (a run killed
    after its last checkpoint) are not counted, as a resumed run truncates them."""
    lines = list(lines)
    last = max((i for i, line in enumerate(lines) if "pending" in line), default=None)
    if last is None:
        return ["the ledger has no pending line (written at each checkpoint and at the run's end)"]
    drawn, settled = Counter(), Counter()
    for line in lines[:last + 1]:
        drawn.update(line.get("drawn", []))
        settled.update(entry["uid"] for entry in line.get("trained", []))
        settled.update(entry["uid"] for entry in line.get("dropped", []))
    settled.update(lines[last]["pending"])
    problems = []
    for uid in sorted(set(drawn) | set(settled)):
        if drawn[uid] != settled[uid]:
            problems.append(f"prompt {uid}: drawn {drawn[uid]} times, trained, dropped or pending {settled[uid]}")
    return problems


def summary(lines: Iterable[dict]) -> dict[str, int]:
    """Counts over a ledger: prompts drawn, trained, dropped (by why), expired, admitted again, pending."""
    lines = list(lines)
    out: Counter = Counter()
    for line in lines:
        out["drawn"] += len(line.get("drawn", []))
        out["trained"] += len(line.get("trained", []))
        out["expired"] += len(line.get("expired", []))
        out["readmitted"] += len(line.get("readmitted", []))
        for entry in line.get("dropped", []):
            out[f"dropped_{entry['why']}"] += 1
    pending = [line for line in lines if "pending" in line]
    out["pending"] = len(pending[-1]["pending"]) if pending else 0
    return dict(out)
