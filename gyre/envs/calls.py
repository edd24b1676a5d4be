"""What the rollout asks of environment slots, what they answer, and the slots themselves.

Sans-IO records shared by the episodes that emit them (``gyre.rollout.episodes``) and the pool that
carries them out on environment workers (``gyre.cluster.env_pool``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from gyre.envs.protocol import EnvFailure, EnvReset, EnvStep


@dataclass(frozen=True)
class EnvCall:
    """Command: reset environment slot ``slot`` to seed ``arg``, or step it with action ``arg``."""

    slot: int
    call_id: str
    """"<episode key>@<n>": unique, and names the episode the answer belongs to."""
    op: Literal["reset", "step"]
    arg: int | str | None


@dataclass(frozen=True)
class EnvResult:
    """Event: the answer to ``EnvCall`` ``call_id``."""

    call_id: str
    value: EnvReset | EnvStep | EnvFailure


@dataclass
class SlotPool:
    """Environment slots (one environment instance each), shared by every scheduler on the same workers."""

    size: int
    free: deque[int] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self.free.extend(range(self.size))
