"""``rollout.elastic``: rollout engines lent to a run and taken back while it trains (ROSE, Spotlight).

The engines of ``rollout.devices`` are the base pool, there for the whole run. Elastic capacity adds
*lent* engines on top of it, up to ``max_engines`` in all: Ray actors started outside the run's device
reservation, wherever the cluster has a device free (serving GPUs between traffic bursts, spot nodes),
given the current weights before they take work, and taken back with a notice (they hand back the tokens
their samples hold, which other engines continue) or without one (their samples are regenerated). Where
capacity comes from: a ``schedule`` by training step (tests, demos, planned windows) and the
``controller``, an operator's function handed the run's ``gyre.rollout.capacity.Capacity`` (``lend(n)``,
``reclaim(n)`` from any thread).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from gyre.config.base import PositiveInt, StrictModel

NonNegFloat = Annotated[float, Field(ge=0)]


class CapacityChange(StrictModel):
    """From training step ``step`` on, the pool holds ``engines`` engines (base ones included)."""

    step: Annotated[int, Field(ge=0)]
    """The training step at whose start the change is asked for (0: before the first, with validation)."""
    engines: PositiveInt
    """Engines in the pool from then on: the base pool plus lent ones (at least len(base), at most max_engines)."""


class ElasticConfig(StrictModel):
    max_engines: PositiveInt
    """Most engines the pool may hold at once, base and lent together."""
    schedule: list[CapacityChange] = []
    """Pool sizes by training step, in step order (e.g. ``[{step: 3, engines: 2}, {step: 6, engines: 1}]``);
    empty: the pool changes only when the controller asks."""
    notice_s: NonNegFloat | None = 30.0
    """A reclaimed engine's notice: it gets no new work and decodes on for up to this long (leaving earlier
    once it holds nothing), then hands back the tokens its samples hold, which other engines continue.
    0: it hands them back at once. null: no notice (a spot instance killed outright): its samples are
    regenerated from scratch elsewhere."""
    wait_for_joins: bool = False
    """A step whose schedule entry grows the pool starts once the new engines serve (waiting at most
    join_timeout_s, and not past a start that failed), instead of training on while they start: the step
    count then sees the capacity (tests, demos, planned windows). The operator's lend() never waits."""
    join_timeout_s: Annotated[float, Field(gt=0)] = 600.0
    """Deadline for a lent engine to start, load the model and take the current weights; one that misses it
    is given up (counted in elastic/join_failures) and the pool asks for another, backing off while starts
    keep failing."""
    resources: dict[str, Annotated[float, Field(gt=0)]] = {}
    """Ray resources a lent engine asks for besides its device (one GPU per tensor-parallel rank, or one
    CPU slot on a CPU run): a custom resource the lent nodes advertise (``{lent_gpu: 1}``, set by
    ``ray start --resources``) keeps lent engines on them. A run on a private local Ray declares enough of
    each for max_engines."""
    controller: str | None = None
    """``module:function`` called once at the run's start with the run's ``Capacity``: an operator's code
    (watch serving traffic, a spot notice feed) that calls ``lend(n)`` / ``reclaim(n)`` from its own thread
    whenever capacity comes or goes."""

    @model_validator(mode="after")
    def _ordered(self) -> ElasticConfig:
        steps = [c.step for c in self.schedule]
        if steps != sorted(set(steps)):
            raise ValueError(f"rollout.elastic.schedule: give each step once, in increasing order (got steps {steps})")
        too_big = [c.engines for c in self.schedule if c.engines > self.max_engines]
        if too_big:
            raise ValueError(f"rollout.elastic.schedule asks for {max(too_big)} engines, above "
                             f"rollout.elastic.max_engines={self.max_engines}: raise max_engines or lower the schedule")
        if self.controller is not None and ":" not in self.controller:
            raise ValueError(f"rollout.elastic.controller={self.controller!r}: name it module:function")
        return self
