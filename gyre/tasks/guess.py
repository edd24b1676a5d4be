"""SFT warm-up transcripts for the agentic quickstart: the number-guessing game played by a policy that
knows the answer format and nothing else.

Each row is one turn of an episode of ``gyre.envs.builtin.guess.GuessNumber`` played with uniformly
random guesses (blind to the hints): ``prompt`` is the conversation so far exactly as a template-less
run builds it (``gyre.envs.context.plain_transcript``), ``response`` the guess in ``\\boxed{}``. The
warm-up teaches the format; reading the hints is left to RL, which is what the quickstart shows.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from gyre.envs.builtin.guess import GuessNumber
from gyre.envs.context import plain_transcript


@dataclass(frozen=True)
class GuessSpec:
    low: int = 1
    high: int = 8
    max_turns: int = 4
    episodes: int = 1500
    seed: int = 4321


def write_guess_task(out_dir: str | Path, spec: GuessSpec = GuessSpec()) -> dict[str, Path]:
    """Write sft.jsonl (prompt, response): every turn of ``spec.episodes`` random-policy episodes."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(spec.seed)
    env = GuessNumber(spec.low, spec.high, spec.max_turns)
    rows = []
    for _ in range(spec.episodes):
        observations, actions = [env.reset(rng.randrange(2 ** 31))[0]], []
        done = False
        while not done:
            action = f"\\boxed{{{rng.randint(spec.low, spec.high)}}}"
            rows.append({"prompt": plain_transcript(observations, actions), "response": action})
            obs, _, terminated, truncated, _ = env.step(action)
            observations.append(obs)
            actions.append(action)
            done = terminated or truncated
    path = out / "sft.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"sft": path}
