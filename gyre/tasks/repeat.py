"""Repeat a character k times: a verifiable task whose prompts set the answer's length, with a long tail.

Prompts look like ``"c*7="`` and the answer is ``"ccccccc"``. Most prompts ask for a few characters, a
few ask for several times more: the response-length distribution whose tail the rollout machine's
schedules (queue scheduling, tail batching, asynchrony) are built for. ``repeat_reward`` scores a
response by how close its length is to k when it holds only the asked character.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from gyre.tasks.arithmetic import _write


@dataclass(frozen=True)
class RepeatSpec:
    short: tuple[int, int] = (1, 6)
    """Lengths of most answers (inclusive range)."""
    long: tuple[int, int] = (24, 40)
    """Lengths of the long tail."""
    long_frac: float = 0.1
    """Share of prompts in the long tail."""
    chars: str = "abcdefghijklmnopqrstuvwxyz"
    train_size: int = 4000
    val_size: int = 200
    sft_size: int = 2000
    seed: int = 4321


def _rows(spec: RepeatSpec, n: int, rng: random.Random) -> list[tuple[str, int]]:
    rows = []
    for _ in range(n):
        lo, hi = spec.long if rng.random() < spec.long_frac else spec.short
        rows.append((rng.choice(spec.chars), rng.randint(lo, hi)))
    return rows


def write_repeat_task(out_dir: str | Path, spec: RepeatSpec = RepeatSpec()) -> dict[str, Path]:
    """Write train.jsonl / val.jsonl (prompt, ground_truth, tag) and sft.jsonl (prompt, response)."""
    rng = random.Random(spec.seed)
    train, val, sft = (_rows(spec, n, rng) for n in (spec.train_size, spec.val_size, spec.sft_size))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"train": out / "train.jsonl", "val": out / "val.jsonl", "sft": out / "sft.jsonl"}
    for name, rows in (("train", train), ("val", val)):
        _write(paths[name], ({"prompt": f"{c}*{k}=", "ground_truth": c * k, "tag": "repeat"} for c, k in rows))
    _write(paths["sft"], ({"prompt": f"{c}*{k}=", "response": c * k} for c, k in sft))
    return paths


def repeat_reward(response: str, ground_truth: str) -> float:
    """1 for exactly the asked characters; less the further the length is off; 0 with a wrong character."""
    response = response.strip()
    if not response or set(response) != set(ground_truth[:1]):
        return 0.0
    return max(0.0, 1.0 - abs(len(response) - len(ground_truth)) / len(ground_truth))
