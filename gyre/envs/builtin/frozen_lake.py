"""FrozenLake as text: walk from S to G on a grid without stepping into a hole (H).

Each seed draws a map (holes at a given density) with a path from S to G (checked by breadth-first
search; maps without one are drawn again). Actions: ``\\boxed{up}``, ``down``, ``left``, ``right``
(or their first letters). Rewards: 1 on reaching G; 0 for falling into a hole (the end) and for other
moves; ``FORMAT_PENALTY`` (and the end) for a turn without a valid action. A move into the edge
stays in place. The grid is shown after every move (P marks the player).
"""

from __future__ import annotations

import random
from collections import deque

from gyre.envs.builtin import MOVES, move, no_move


class FrozenLake:
    def __init__(self, size: int = 4, hole_density: float = 0.2, max_turns: int | None = None):
        if size < 2:
            raise ValueError("size must be at least 2")
        self.size, self.density = size, hole_density
        self.max_turns = max_turns or 2 * size * size
        self.grid: list[list[str]] = []
        self.pos, self.turn = (0, 0), 0

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        rng = random.Random(seed)
        while True:
            grid = [["H" if rng.random() < self.density else "F" for _ in range(self.size)] for _ in range(self.size)]
            grid[0][0], grid[-1][-1] = "S", "G"
            if _reachable(grid):
                break
        self.grid, self.pos, self.turn = grid, (0, 0), 0
        return ("Walk from S to G without stepping on a hole H. Moves: up, down, left, right, e.g. \\boxed{right}.\n"
                + self.render()), {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.turn += 1
        step = move(action)
        if step is None:
            return no_move()
        dr, dc = step
        r, c = self.pos
        self.pos = (min(max(r + dr, 0), self.size - 1), min(max(c + dc, 0), self.size - 1))
        cell = self.grid[self.pos[0]][self.pos[1]]
        if cell == "G":
            return self.render() + "\nYou reached the goal!", 1.0, True, False, {"success": True}
        if cell == "H":
            return self.render() + "\nYou fell into a hole.", 0.0, True, False, {}
        return self.render(), 0.0, False, self.turn >= self.max_turns, {}

    def render(self) -> str:
        rows = []
        for r, row in enumerate(self.grid):
            rows.append("".join("P" if (r, c) == self.pos else cell for c, cell in enumerate(row)))
        return "\n".join(rows)


def _reachable(grid: list[list[str]]) -> bool:
    n = len(grid)
    seen, todo = {(0, 0)}, deque([(0, 0)])
    while todo:
        r, c = todo.popleft()
        if grid[r][c] == "G":
            return True
        for dr, dc in MOVES.values():
            nxt = (r + dr, c + dc)
            if 0 <= nxt[0] < n and 0 <= nxt[1] < n and nxt not in seen and grid[nxt[0]][nxt[1]] != "H":
                seen.add(nxt)
                todo.append(nxt)
    return False
