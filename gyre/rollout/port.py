"""The port the rollout machine drives: the real driver over Ray actors, or the simulated cluster.

``RolloutMachine`` (``gyre.rollout.machine``) holds the policy of a run's rollout: when to admit, when a
batch is complete, when a weight publication may load (lockstep's hold), what a checkpoint keeps. A
``RolloutPort`` carries out its scheduler's commands on engines, reward workers and environments and
turns what comes back into the scheduler's events. Two implementations keep the same contract:

- ``gyre.rollout.driver.RolloutDriver``: Ray actors (or in-process ones), wall-clock deadlines, engines
  replaced in place when they die or hang.
- ``gyre.sim.cluster.SimCluster``: simulated engines, rewards and environments on a virtual clock; an
  engine never fails, but engines may join and leave (elastic capacity).

Their differences are written down where they are: the deadline to wait for (``until``) is the
learner's calls in a real run and a virtual time in a simulated one, and only the real driver replaces
engines. Everything else (the scheduling) is the one machine's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gyre.types import WeightVersion

if TYPE_CHECKING:
    from gyre.rollout.scheduler import RolloutScheduler


@dataclass
class PhaseTimes:
    """Where one ``run`` spent its time (wall-clock seconds, or virtual ones in a simulation)."""

    generate: float = 0.0
    """Until no sample was left to generate (scoring overlaps it)."""
    reward: float = 0.0
    """Scoring still running after that."""


class RolloutPort(Protocol):
    @property
    def engine_count(self) -> int:
        """Rollout engines (ranks) requests are spread over."""

    def run(self, scheduler: RolloutScheduler, done: Callable[[], bool], label: str = "train",
            refill: Callable[[], None] | None = None, until: Any = None) -> PhaseTimes:
        """Carry out ``scheduler``'s commands and feed it what comes back until ``done()``; ``refill()``
        may admit more after each event. ``until``: return early once it is reached (the real driver:
        a ``CallWait``, the learner's calls being ready; the simulator: a virtual time)."""

    def send(self, commands: list) -> None:
        """Carry out commands now, in order."""

    def load_weights(self, version: WeightVersion, weights: Any, partial: bool) -> None:
        """Every engine takes ``version`` at its next step boundary (``weights``: what the learner
        exported; None where the engines already hold them). Raises if an engine reports another."""

    def release(self, scheduler: RolloutScheduler) -> None:
        """``scheduler`` is done: late results of its requests are dropped."""

    def busy_seconds(self) -> list[float]:
        """Seconds each engine spent prefilling and decoding since the last call."""

    def close(self) -> None:
        """End what ``run`` opened (the engines live on)."""
