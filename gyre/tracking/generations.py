"""Sample generations of a run: what the model wrote, what it was paid and what it trained on.

Every ``logging.generations_every`` steps (and at the last) a few of the step's train generations, and
at every validation a few held-out ones, go to ``RUN_DIR/generations/step_<N>.jsonl`` and
``generations/val_step_<N>.jsonl`` (one ``GenerationRecord`` per line) and to the trackers' tables
("generations", "val/generations"). The sample is picked without randomness (no RNG stream of the run
is touched): groups spread over the batch, and within a group alternately its best and worst response.
A resumed run writes its steps' files again, replacing what the interrupted run wrote for them.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from gyre.types import Group, TrainBatch, Trajectory


@dataclass
class GenerationRecord:
    """One sampled generation, as a line of generations/step_<N>.jsonl."""

    step: int
    """The RL step (0: the validation before training)."""
    split: Literal["train", "val"]
    group: str
    """The group id (the samples of one prompt)."""
    sample: int
    """Its index in the group."""
    domain: str | None
    """The reward domain of a multi-domain run; None in a single-domain one."""
    prompt: str
    response: str
    """The decoded response (multi-turn: every token after the prompt, observations included)."""
    reward: float
    correct: bool | None
    """Whether the reward judged the answer right (``RewardResult.correct``); None when it cannot tell, or
    without a reward."""
    advantage: float | None
    """The mean advantage over the tokens it trained (None for validation, or when none trained)."""
    weight_version: int
    """The policy version that generated its first token."""
    finish_reason: str
    response_tokens: int
    """Tokens the model sampled (observations excluded)."""
    turns: list[dict] | None
    """Multi-turn: each model turn and each observation between them, {role: assistant|env, text, reward}
    (the environment's reward for the turn on the assistant's entry); None for single-turn samples."""


Decode = Callable[[list[int]], str]


def pick_samples(groups: Sequence[Group], k: int) -> list[tuple[Group, Trajectory]]:
    """``k`` samples without randomness: ``k`` groups spread evenly over the batch (every group when there
    are fewer, sharing ``k`` round-robin); within a group, alternately its highest and lowest reward, the
    first chosen group starting high and the next low, so a sample shows both ends."""
    groups = [g for g in groups if g.trajectories]
    if not groups or k <= 0:
        return []
    n = len(groups)
    chosen = [groups[i * n // k] for i in range(k)] if k < n else groups
    picks = []
    for i, group in enumerate(chosen):
        quota = k // len(chosen) + (1 if i < k % len(chosen) else 0)
        picks += [(group, t) for t in _extremes(group.trajectories, high_first=i % 2 == 0)[:quota]]
    return picks


def _extremes(trajectories: Sequence[Trajectory], high_first: bool) -> list[Trajectory]:
    ranked = sorted(trajectories, key=lambda t: (-_score(t), t.sample_index))
    order, lo, hi, high = [], 0, len(ranked) - 1, high_first
    while lo <= hi:
        if high:
            order.append(ranked[lo])
            lo += 1
        else:
            order.append(ranked[hi])
            hi -= 1
        high = not high
    return order


def _score(t: Trajectory) -> float:
    return t.reward.score if t.reward is not None else 0.0


def mean_advantages(groups: Sequence[Group], batch: TrainBatch) -> dict[int, float | None]:
    """Each trajectory's mean advantage over its trained tokens, by ``id(trajectory)``. Rows are laid out as
    ``collate_groups`` lays them: trajectories in group order, each with ``len(t.rows())`` rows (several for
    step-level samples of a multi-turn trajectory)."""
    out: dict[int, float | None] = {}
    row = 0
    for t in (t for g in groups for t in g.trajectories):
        rows = slice(row, row + len(t.rows()))
        row = rows.stop
        mask = batch.response_mask[rows]
        tokens = float(mask.sum())
        out[id(t)] = float((batch.advantages[rows] * mask).sum()) / tokens if tokens > 0 else None
    return out


def build_record(step: int, split: Literal["train", "val"], group: Group, t: Trajectory, decode: Decode,
                 advantage: float | None, multi_domain: bool) -> GenerationRecord:
    ids = t.response_ids
    sampled = [s for s in t.segments if s.weight_version is not None]
    return GenerationRecord(
        step=step, split=split, group=group.group_id, sample=t.sample_index,
        domain=t.prompt.domain if multi_domain else None, prompt=t.prompt.prompt_text,
        response=t.response_text if t.response_text or not ids else decode(ids),
        reward=_score(t), correct=t.reward.correct if t.reward is not None else None, advantage=advantage,
        weight_version=sampled[0].weight_version if sampled else -1, finish_reason=t.finish_reason or "",
        response_tokens=sum(len(s.token_ids) for s in sampled), turns=turn_texts(t, decode) if t.turns else None)


def turn_texts(t: Trajectory, decode: Decode) -> list[dict]:
    """A multi-turn trajectory as its model turns and the observations between them."""
    ids, out = t.response_ids, []
    for k, turn in enumerate(t.turns):
        out.append({"role": "assistant", "text": decode(ids[turn.start:turn.end]), "reward": turn.reward})
        until = t.turns[k + 1].start if k + 1 < len(t.turns) else len(ids)
        if until > turn.end:
            out.append({"role": "env", "text": decode(ids[turn.end:until]), "reward": None})
    return out


class GenerationWriter:
    """Writes the sampled generations of train steps and validations (``logging.generations_*``)."""

    def __init__(self, out_dir: Path, logger, every: int, samples: int, decode: Decode, multi_domain: bool,
                 last_step: int):
        """``logger``: the run's MetricsLogger (its trackers get the tables); ``every``: 0 writes nothing."""
        self.dir, self.logger, self.every, self.samples = Path(out_dir), logger, every, samples
        self.decode, self.multi_domain, self.last_step = decode, multi_domain, last_step

    def train(self, step: int, groups: Sequence[Group], batch: TrainBatch) -> None:
        """A train step's sample, with each generation's advantage from the collated ``batch``."""
        if not self.every or (step % self.every and step != self.last_step):
            return
        advantages = mean_advantages(groups, batch)
        records = [build_record(step, "train", g, t, self.decode, advantages.get(id(t)), self.multi_domain)
                   for g, t in pick_samples(groups, self.samples)]
        self.write(self.dir / f"step_{step}.jsonl", "generations", step, records)

    def validation(self, step: int, groups: Sequence[Group]) -> None:
        if not self.every:
            return
        records = [build_record(step, "val", g, t, self.decode, None, self.multi_domain)
                   for g, t in pick_samples(groups, self.samples)]
        self.write(self.dir / f"val_step_{step}.jsonl", "val/generations", step, records)

    def write(self, path: Path, table: str, step: int, records: list[GenerationRecord]) -> None:
        """The file replaced whole (a resumed run's step overwrites the interrupted one's), then the table."""
        if not records:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = [asdict(r) for r in records]
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
        os.replace(tmp, path)
        self.logger.log_table(table, step, rows)


def drop_generations_after(out_dir: Path, step: int | None) -> None:
    """A resumed (or restarted: ``step`` None) run drops its own generation files of the steps it will run
    again, as metrics.jsonl drops their records: a file left from an interrupted step could otherwise
    outlive it when the resumed run samples other steps (``generations_every`` changed, or it stops early)."""
    for path in Path(out_dir).glob("*step_*.jsonl"):
        match = re.fullmatch(r"(?:val_)?step_(\d+)\.jsonl", path.name)
        if match and (step is None or int(match.group(1)) > step):
            path.unlink()


def read_generations(path: str | Path) -> list[GenerationRecord]:
    return [GenerationRecord(**_current(json.loads(line))) for line in Path(path).read_text().splitlines()
            if line.strip()]


def _current(row: dict) -> dict:
    """A row in today's fields: files written before the rename call ``correct`` ``passed``."""
    if "passed" in row and "correct" not in row:
        row = {("correct" if k == "passed" else k): v for k, v in row.items()}
    return row
