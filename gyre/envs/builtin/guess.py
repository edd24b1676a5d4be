"""Guess the number: the environment answers "higher" or "lower" until the guess is right.

Rewards: 1 for the right number, 0 for any other valid guess, ``FORMAT_PENALTY`` (and the end) for a
turn without ``\\boxed{n}``. An optimal policy bisects: ceil(log2(high - low + 1)) guesses at most.
"""

from __future__ import annotations

import math
import random

from gyre.envs.builtin import FORMAT_PENALTY, boxed


class GuessNumber:
    def __init__(self, low: int = 1, high: int = 16, max_turns: int | None = None):
        if high <= low:
            raise ValueError(f"high ({high}) must be above low ({low})")
        self.low, self.high = low, high
        self.max_turns = max_turns or math.ceil(math.log2(high - low + 1)) + 1
        self.secret, self.turn = low, 0

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        self.secret = random.Random(seed).randint(self.low, self.high)
        self.turn = 0
        return (f"Guess my number between {self.low} and {self.high} in at most {self.max_turns} guesses. "
                "After each guess I say higher or lower. Answer like \\boxed{7}."), {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.turn += 1
        text = boxed(action)
        if text is None or not text.lstrip("-").isdigit():
            return "No guess in \\boxed{}: game over.", FORMAT_PENALTY, True, False, {"format_error": True}
        guess = int(text)
        if guess == self.secret:
            return f"{guess} is right!", 1.0, True, False, {"success": True}
        hint = "higher" if guess < self.secret else "lower"
        out_of_turns = self.turn >= self.max_turns
        obs = f"{guess}: {hint}." + (" No guesses left." if out_of_turns else "")
        return obs, 0.0, False, out_of_turns, {}
