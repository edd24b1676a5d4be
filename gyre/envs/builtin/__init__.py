"""gyre's built-in text environments (``gyre:<name>`` in a config; see ``gyre.envs.protocol.BUILTIN``).

Each follows GEM's conventions so a policy trained on one transfers its format: the action is the
last ``\\boxed{...}`` in the model's turn; an action that has none ends the episode with
``FORMAT_PENALTY``; success pays 1.
"""

import re

FORMAT_PENALTY = -0.1
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
"""Grid moves as (row, column) steps; their first letters work too."""


def boxed(action: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``action`` (stripped), or None."""
    found = _BOXED.findall(action)
    return found[-1].strip() if found else None


def move(action: str) -> tuple[int, int] | None:
    """The grid move in ``action``'s last ``\\boxed{...}`` (up, down, left, right or u, d, l, r), or None."""
    text = (boxed(action) or "").lower()
    text = {m[0]: m for m in MOVES}.get(text, text)
    return MOVES.get(text)


def no_move() -> tuple[str, float, bool, bool, dict]:
    """The step result of a turn without a valid move (grid games): the format penalty, and the end."""
    return "No valid move in \\boxed{}: game over.", FORMAT_PENALTY, True, False, {"format_error": True}
