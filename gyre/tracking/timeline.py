"""The driver's side of the phase timeline: it takes the spans every worker recorded
(``gyre.cluster.spans``), names their lanes and appends them to ``RUN_DIR/timeline.jsonl``.

One JSON object per span: ``{role, rank, phase, start, end, step}``, start and end in wall-clock
seconds. ``role`` is the RL role (policy, rollout, reference, critic, teacher, reward, env, driver);
groups of one role (several critics, reward domains) number their workers on from each other, so
(role, rank) names one worker. ``step`` is the RL step during which the driver took the span (a
rollout span of an asynchronous run may produce samples a later step trains on). A span's ``end``
may fall after its step's records: a call that ran across the drain comes with the next step.

The driver takes spans once per step, on each actor's probe thread, with a deadline; an actor that
does not answer in time keeps its spans for a later take, which does not wait for it again. On resume the
records of steps after the checkpoint are dropped, as ``metrics.jsonl``'s are.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

from gyre.cluster.spans import take_spans
from gyre.tracking.logger import BEFORE_EVERYTHING, truncate_after

TAKE_DEADLINE_S = 5.0
"""How long one take waits for the workers' answers (they answer on their probe thread, in milliseconds)."""
_ROLE_OF = {"judge": "reward", "reward_model": "reward"}
"""Role groups named otherwise than their RL role (``judge.math`` scores rewards)."""


@dataclass(frozen=True)
class Span:
    """One interval of one worker's time spent in one phase."""

    role: str
    """The RL role: policy, rollout, reference, critic, teacher, reward, env or driver."""
    rank: int
    """The worker's number within its role."""
    phase: str
    """generate, reward, logprobs, train, weight_sync, env_step (workers); validate, checkpoint, report (the
    driver: report is its writing report.html at a validation)."""
    start: float
    """Wall-clock seconds (``time.time()``)."""
    end: float
    step: int
    """The RL step during which the driver took it."""


def role_of(group_name: str) -> str:
    """The RL role of a role group: ``reward.math`` -> reward, ``critic.1`` -> critic."""
    base = group_name.split(".")[0]
    return _ROLE_OF.get(base, base)


def lanes(groups: Iterable) -> list[tuple[str, int, object]]:
    """(role, rank, actor) of every worker of ``groups`` (a group listed twice counts once)."""
    out, seen, next_rank = [], set(), {}
    for group in groups:
        if group is None or id(group) in seen:
            continue
        seen.add(id(group))
        role = role_of(group.name)
        for actor in group.actors:
            rank = next_rank.get(role, 0)
            next_rank[role] = rank + 1
            if actor is not None:  # a vacated rank (a lent engine taken back) keeps its number
                out.append((role, rank, actor))
    return out


class Timeline:
    def __init__(self, output_dir: str | Path | None, resume_step: int | None = None, restart: bool = False,
                 deadline_s: float = TAKE_DEADLINE_S):
        """``output_dir`` None records nothing. ``resume_step`` / ``restart`` as ``MetricsLogger``'s."""
        self.path = Path(output_dir) / "timeline.jsonl" if output_dir is not None else None
        self.deadline_s = deadline_s
        self.dropped = 0
        """Spans the workers' full buffers dropped (a take came too late for them)."""
        self._pending: dict[tuple[str, int], object] = {}
        """Takes sent but not answered yet, by lane: answered at a later take."""
        self._driver: list[Span] = []
        """The driver's spans since the last take (written with the workers', in time order)."""
        if self.path is not None and (resume_step is not None or restart):
            truncate_after(self.path, BEFORE_EVERYTHING if restart else resume_step)

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def driver(self, phase: str, step: int):
        """A context in which the driver spends ``phase`` of ``step`` (recorded as the driver's lane)."""
        return self._driver_span(phase, step) if self.enabled else nullcontext()

    @contextmanager
    def _driver_span(self, phase: str, step: int):
        start = time.time()
        try:
            yield
        finally:
            self._driver.append(Span("driver", 0, phase, start, time.time(), step))

    def collect(self, groups: Iterable, step: int) -> None:
        """Take every worker's spans since the last take and append them as ``step``'s."""
        if not self.enabled:
            return
        from gyre.cluster import transport
        from gyre.cluster.faults import PROBE

        spans, self._driver = self._driver, []
        by_lane = {(role, rank): actor for role, rank, actor in lanes(groups)}
        fresh = []
        for lane, actor in by_lane.items():
            if lane not in self._pending:
                self._pending[lane] = actor.__ray_call__.options(concurrency_group=PROBE).remote(take_spans)
                fresh.append(self._pending[lane])
        if fresh:  # a take that missed an earlier deadline is not waited for again: it is collected once ready
            transport.wait(fresh, num_returns=len(fresh), timeout=self.deadline_s)
        refs = list(self._pending.values())
        ready, _ = transport.wait(refs, num_returns=len(refs), timeout=0) if refs else ([], [])
        answered = {id(r) for r in ready}
        for (role, rank), ref in list(self._pending.items()):
            if id(ref) not in answered:
                continue
            del self._pending[(role, rank)]
            try:
                taken, dropped = transport.get(ref, timeout=0)
            except transport.RemoteError:  # a dead actor's spans are gone with it; the run goes on
                continue
            self.dropped += dropped
            spans += [Span(role, rank, name, start, end, step) for name, start, end in taken]
        self.write(sorted(spans, key=lambda s: s.start))

    def write(self, spans: list[Span]) -> None:
        if not spans or self.path is None:
            return
        with self.path.open("a") as fh:
            fh.write("".join(json.dumps(_record(s)) + "\n" for s in spans))


def _record(span: Span) -> dict:
    record = asdict(span)
    record["start"], record["end"] = round(span.start, 4), round(span.end, 4)
    return record


def read_spans(path: str | Path) -> list[Span]:
    """The spans of a ``timeline.jsonl`` (a line cut short by a kill, or otherwise malformed, is skipped)."""
    return read_spans_counted(path)[0]


def read_spans_counted(path: str | Path) -> tuple[list[Span], int]:
    """The spans of a ``timeline.jsonl`` and how many lines were skipped: cut short, or not a span (a field
    missing or extra, or of the wrong type: a hand-edited or foreign file must not break ``gyre report``)."""
    out, skipped = [], 0
    for line in Path(path).read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            span = _span(json.loads(line))
        except json.JSONDecodeError:
            span = None
        if span is None:
            skipped += 1
        else:
            out.append(span)
    return out, skipped


def _span(record) -> Span | None:
    if not isinstance(record, dict) or set(record) != {"role", "rank", "phase", "start", "end", "step"}:
        return None
    texts = all(isinstance(record[k], str) for k in ("role", "phase"))
    ints = all(isinstance(record[k], int) and not isinstance(record[k], bool) for k in ("rank", "step"))
    times = all(isinstance(record[k], (int, float)) and not isinstance(record[k], bool)
                and math.isfinite(record[k]) for k in ("start", "end"))
    return Span(**record) if texts and ints and times and record["end"] >= record["start"] else None
