"""Sokoban as text: push every box (B) onto a target (T).

Each seed draws a room (walls around, a few inside) and scrambles a solved position by reverse play:
the player walks and pulls boxes, so the forward puzzle is solvable by construction. Actions as in
FrozenLake: ``\\boxed{up}``, ``down``, ``left``, ``right``; walking into a wall, or pushing a box
into a wall or another box, leaves everything in place. Rewards: 1 when every box is on a target;
``FORMAT_PENALTY`` (and the end) for a turn without a valid action; 0 otherwise. Cells: ``#`` wall,
``.`` floor, ``T`` target, ``B`` box, ``*`` box on a target, ``P`` player (``p`` on a target).
"""

from __future__ import annotations

import random

from gyre.envs.builtin import MOVES, move, no_move


class Sokoban:
    def __init__(self, width: int = 6, height: int = 6, boxes: int = 1, scramble: int = 12,
                 max_turns: int | None = None):
        if width < 4 or height < 4:
            raise ValueError("a room needs width and height of at least 4")
        self.width, self.height, self.n_boxes, self.scramble = width, height, boxes, scramble
        self.max_turns = max_turns or 3 * scramble
        self.walls: set = set()
        self.targets: set = set()
        self.boxes: set = set()
        self.player, self.turn = (1, 1), 0

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        rng = random.Random(seed)
        while not self._draw(rng):
            pass
        self.turn = 0
        return ("Push every box B onto a target T. Moves: up, down, left, right, e.g. \\boxed{up}.\n"
                + self.render()), {}

    def _draw(self, rng: random.Random) -> bool:
        """One room scrambled from its solution; False when the scramble left it solved (draw again)."""
        inner = [(r, c) for r in range(1, self.height - 1) for c in range(1, self.width - 1)]
        self.walls = {(r, c) for r in range(self.height) for c in range(self.width)} - set(inner)
        self.walls |= set(rng.sample(inner, k=len(inner) // 10))
        free = [p for p in inner if p not in self.walls]
        if len(free) < self.n_boxes + 1:
            return False
        self.targets = set(rng.sample(free, k=self.n_boxes))
        self.boxes = set(self.targets)
        self.player = rng.choice([p for p in free if p not in self.boxes])
        for _ in range(self.scramble):
            self._pull(rng.choice(list(MOVES.values())))
        return self.boxes != self.targets

    def _pull(self, move: tuple[int, int]) -> None:
        """Reverse play: walk one step, dragging a box that was right behind the player."""
        dest = (self.player[0] + move[0], self.player[1] + move[1])
        if dest in self.walls or dest in self.boxes:
            return
        behind = (self.player[0] - move[0], self.player[1] - move[1])
        if behind in self.boxes:
            self.boxes = (self.boxes - {behind}) | {self.player}
        self.player = dest

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.turn += 1
        step = move(action)
        if step is None:
            return no_move()
        dr, dc = step
        dest = (self.player[0] + dr, self.player[1] + dc)
        if dest in self.boxes:
            beyond = (dest[0] + dr, dest[1] + dc)
            if beyond not in self.walls and beyond not in self.boxes:
                self.boxes = (self.boxes - {dest}) | {beyond}
                self.player = dest
        elif dest not in self.walls:
            self.player = dest
        if self.boxes == self.targets:
            return self.render() + "\nSolved!", 1.0, True, False, {"success": True}
        return self.render(), 0.0, False, self.turn >= self.max_turns, {}

    def render(self) -> str:
        rows = []
        for r in range(self.height):
            row = ""
            for c in range(self.width):
                p = (r, c)
                if p in self.walls:
                    row += "#"
                elif p == self.player:
                    row += "p" if p in self.targets else "P"
                elif p in self.boxes:
                    row += "*" if p in self.targets else "B"
                else:
                    row += "T" if p in self.targets else "."
            rows.append(row)
        return "\n".join(rows)
