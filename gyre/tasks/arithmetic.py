"""Multi-digit arithmetic with a held-out split: a verifiable task a tiny model can learn on a CPU.

Prompts look like ``"47+38="`` and the answer is the integer (``"85"``), scored by the math reward.
Every problem is in exactly one of the splits (train, held-out validation); the SFT warm-up set is a
small slice of the training split, so held-out accuracy measures generalisation, not recall.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ArithmeticSpec:
    digits: int = 2
    ops: str = "+"
    val_size: int = 500
    sft_size: int = 4000
    seed: int = 1234


def _problems(spec: ArithmeticSpec) -> list[tuple[int, str, int]]:
    lo, hi = 10 ** (spec.digits - 1) if spec.digits > 1 else 0, 10 ** spec.digits - 1
    return [(a, op, b) for a in range(lo, hi + 1) for op in spec.ops for b in range(lo, hi + 1)]


def _answer(a: int, op: str, b: int) -> int:
    return {"+": a + b, "-": a - b, "*": a * b}[op]


def write_arithmetic_task(out_dir: str | Path, spec: ArithmeticSpec = ArithmeticSpec()) -> dict[str, Path]:
    """Write train.jsonl / val.jsonl (prompt, ground_truth, tag) and sft.jsonl (prompt, response)."""
    problems = _problems(spec)
    rng = random.Random(spec.seed)
    rng.shuffle(problems)
    val, train = problems[:spec.val_size], problems[spec.val_size:]
    if not train:
        raise ValueError(f"{len(problems)} problems leave none for training after {spec.val_size} held out")
    sft = train[:spec.sft_size]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"train": out / "train.jsonl", "val": out / "val.jsonl", "sft": out / "sft.jsonl"}
    _write(paths["train"], ({"prompt": f"{a}{op}{b}=", "ground_truth": str(_answer(a, op, b)), "tag": "arithmetic"}
                            for a, op, b in train))
    _write(paths["val"], ({"prompt": f"{a}{op}{b}=", "ground_truth": str(_answer(a, op, b)), "tag": "arithmetic"}
                          for a, op, b in val))
    _write(paths["sft"], ({"prompt": f"{a}{op}{b}=", "response": str(_answer(a, op, b))} for a, op, b in sft))
    return paths


def _write(path: Path, rows) -> None:
    tmp = path.with_suffix(".partial")
    with tmp.open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    tmp.replace(path)
