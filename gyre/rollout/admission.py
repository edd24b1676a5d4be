"""Admission regimes: which groups the scheduler admits when, which batch a step takes, what a checkpoint keeps.

The scheduler (``gyre.rollout.scheduler``) owns every group's lifecycle; an ``Admission`` owns the three
decisions that differ between regimes, and its own checkpoint state:

- ``Window`` (ROLL Flash, ``systems.md`` 2.2): admit whatever capacity allows, P (1 + alpha) groups
  admitted and not yet trained (plus redundancy), under whatever version the engines hold; a step takes
  the oldest committed groups within the staleness window. alpha = 0 is synchronous training: one round
  of admissions per step, the first P groups to commit train and the rest are aborted (redundancy).
- ``TailRounds`` (RollPacker, 3.1; alpha = 0): each step is one round, short (speculative: more prompts
  and samples, the first P groups train, the cut prompts wait in a long queue) or long (P prompts of the
  long queue, run to completion). Every drawn prompt trains exactly once.
- ``Lockstep``: the version that generates each group is fixed in advance (``LockstepPlan``), so a run is
  reproducible and resumes exactly; dynamic sampling refills only the oldest unsettled batch.

Each talks to the scheduler through its public surface: ``launch``, ``flights``, ``buffer``,
``filtered``, ``drawn``, ``within_draws``, ``in_flight``, ``fall_back``, ``abort_group``, ``count``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from gyre.rollout.buffer import oldest_quota, staleness_limit
from gyre.rollout.policies import TailBatching
from gyre.types import Group, PromptRecord

if TYPE_CHECKING:
    from gyre.rollout.scheduler import RolloutScheduler

Draw = Callable[[int], list[PromptRecord]]
"""``draw(k)``: the next k training prompts."""


class Admission(Protocol):
    def admit(self, step: int, draw: Draw) -> None:
        """Admit what the regime allows now, for step ``step``."""

    def ready(self, step: int) -> bool:
        """Step ``step``'s batch is committed."""

    def take(self, step: int) -> list[Group]:
        """Step ``step``'s batch (``ready`` held); what else the step no longer needs is aborted."""

    @property
    def settled(self) -> bool:
        """Nothing is left to generate for the version the engines hold."""

    def gauges(self) -> dict[str, float]:
        """The regime's own state, for the step's metrics."""

    def waiting(self) -> list[str]:
        """Uids of prompts drawn and not admitted now that the regime itself keeps (tail batching's long queue)."""

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the rollout (see ``RolloutScheduler.state_dict``)."""

    def load_state_dict(self, state: dict, prompts: dict[str, PromptRecord], step: int) -> list[PromptRecord]:
        """Restore a checkpoint of step ``step``; returns the prompts to admit again."""


def for_scheduler(s: RolloutScheduler) -> Admission:
    """The regime ``s.spec`` asks for."""
    if s.spec.lockstep:
        return Lockstep(s)
    if s.spec.tail is not None:
        return TailRounds(s)
    return Window(s)


def known(prompts: dict[str, PromptRecord], uids: list[str]) -> None:
    """Raise unless this run's data holds every prompt a checkpoint names."""
    missing = [uid for uid in uids if uid not in prompts]
    if missing:
        raise ValueError(f"the checkpoint's rollout holds prompts this run's data lacks, e.g. {missing[:3]}")


class Window:
    """ROLL Flash's window: admit as capacity frees; take the oldest committed groups within the window."""

    def __init__(self, s: RolloutScheduler):
        self.s = s

    def capacity(self, step: int) -> int:
        """Groups that may be admitted now: as many as can still train within the staleness window, plus
        redundancy, less those admitted and not yet trained on (ROLL Flash rule 3, throttled as AReaL
        throttles submission), within ``max_draws`` for the step.

        A group admitted now starts at the engines' version v and can train in steps up to v + L + 1
        (L = ceil(alpha); in the last of them only ``oldest_quota`` groups that old). Groups are taken
        oldest first, P a step, from step ``taken`` + 1 on, so the window holds P (v + L - taken) +
        quota of them: P (1 + alpha) once the weights of the last step taken are published, P alone while
        that step still trains (v = taken - 1), and P at alpha = 0. Admitting more only generates groups
        that expire unused (at alpha 1, half of what was generated)."""
        s, spec = self.s, self.s.spec
        size, limit = spec.batch_groups, staleness_limit(spec.async_ratio)
        steps = s.version + limit - s.taken  # full batches before the edge step
        window = max(0, size * steps + oldest_quota(spec.async_ratio, size))
        budget = window + spec.redundancy
        return max(0, s.within_draws(step, budget - len(s.flights) - len(s.buffer)))

    def admit(self, step: int, draw: Draw) -> None:
        k = self.capacity(step)
        if k:
            prompts = draw(k)
            self.s.launch(step, prompts, self.s.spec.launched)
            self.s.count("rollout/groups_admitted", len(prompts))

    def ready(self, step: int) -> bool:
        """A full batch within the staleness window (when dynamic sampling has used up its draws, rejected
        groups complete it: ``rollout/filter_fallback``), and no group still generating whose last chance
        to train is this step: a batch filled by younger groups that finished first would let it expire,
        its tokens wasted and its prompt generated again. Waiting for it costs less (simulated long tail,
        alpha 1-2: trained tokens/s +12% to +35%, waste from about 30% of generated tokens to 0-3%), and
        keeps the batches in admission order, as admission planned them."""
        s = self.s
        size, alpha = s.spec.batch_groups, s.spec.async_ratio
        if not s.buffer.ready(step, size, alpha):  # (a fallback needs nothing in flight: no last chance either)
            if not (s.filtered and not s.flights and not self.capacity(step) and s.spec.max_draws is not None):
                return False
            s.fall_back(list(s.filtered), lambda: s.buffer.ready(step, size, alpha))
            return s.buffer.ready(step, size, alpha)
        return not (alpha > 0 and self._last_chance_in_flight(step))  # scanned only for a full batch

    def _last_chance_in_flight(self, step: int) -> bool:
        """A group still generating would be too old for any step after ``step`` (at most ``oldest_quota`` of
        them: the publication trims the rest)."""
        limit = staleness_limit(self.s.spec.async_ratio)
        return any(step - 1 - f.group.admitted_version >= limit for f in self.s.flights.values())

    def take(self, step: int) -> list[Group]:
        """P committed groups, oldest admitted first. Synchronous (alpha = 0): what else was admitted for
        this step is aborted (redundant)."""
        groups = self.s.buffer.take(step, self.s.spec.batch_groups, self.s.spec.async_ratio)
        if self.s.spec.async_ratio == 0:
            self._end_round(step, "rollout/groups_redundant", why="redundant")
        self.s.took(step, groups)
        return groups

    def _end_round(self, step: int, counter: str, why: str | None = None) -> list[PromptRecord]:
        """Abort what step ``step`` no longer needs, in flight or committed one too many; their prompts
        (dropped for ``why``, else the caller keeps them)."""
        s, left = self.s, []
        for flight in [f for f in s.flights.values() if f.step <= step]:
            s.abort_group(flight, counter, why)
            left.append(flight.group.prompt)
        for group in s.buffer.drop_expired(step + 1, 0.0):  # committed too, but one too many
            s.drop_committed(group, counter, why)
            left.append(group.prompt)
        return left

    @property
    def settled(self) -> bool:
        return self.s.idle

    def gauges(self) -> dict[str, float]:
        return {}

    def waiting(self) -> list[str]:
        return []

    def state_dict(self) -> dict:
        """The prompts drawn and not yet trained on, oldest first: those of expired groups waiting to be
        admitted again, then those admitted (in flight or committed), then those dynamic sampling rejected
        but kept for a fallback. What was generated for them is not kept: a resumed run admits them again,
        before drawing new prompts, so none is lost or drawn twice."""
        return {"admitted": self.s.readmit_prompts(), "long_queue": []}

    def load_state_dict(self, state: dict, prompts: dict[str, PromptRecord], step: int) -> list[PromptRecord]:
        known(prompts, [*state.get("admitted", []), *state.get("long_queue", [])])
        self.s.taken = step
        return [prompts[uid] for uid in state.get("admitted", [])]


class TailRounds(Window):
    """RollPacker's tail batching: one short or long round per step (``gyre.rollout.policies``)."""

    def __init__(self, s: RolloutScheduler):
        super().__init__(s)
        self.tail = TailBatching(s.spec.tail)

    def admit(self, step: int, draw: Draw) -> None:
        """The step's one round, planned when the step has none yet."""
        s = self.s
        if step in s.drawn:
            return
        kind, k, samples = self.tail.plan(s.spec.batch_groups, s.spec.group_size)
        if kind == "long":
            prompts = self.tail.take_long(k)
            s.note("readmitted", [p.uid for p in prompts])
        else:
            prompts = draw(k)
        self.tail.rounds[kind] += 1
        s.stats["rollout/long_round"] = float(kind == "long")
        s.launch(step, prompts, samples)
        s.count("rollout/groups_admitted", len(prompts))

    def take(self, step: int) -> list[Group]:
        """The first P groups of the round train; the prompts of the others wait in the long queue."""
        groups = self.s.buffer.take(step, self.s.spec.batch_groups, 0.0)
        cut = self._end_round(step, "rollout/groups_cut")
        self.tail.cut(cut)
        self.s.note("cut", [p.uid for p in cut])
        self.s.took(step, groups)
        return groups

    def gauges(self) -> dict[str, float]:
        return {"rollout/long_queue": len(self.tail.long_queue)}

    def waiting(self) -> list[str]:
        return [p.uid for p in self.tail.long_queue]

    def state_dict(self) -> dict:
        """As the window's, and the prompts waiting in the long queue."""
        return {**super().state_dict(), "long_queue": [p.uid for p in self.tail.long_queue]}

    def load_state_dict(self, state: dict, prompts: dict[str, PromptRecord], step: int) -> list[PromptRecord]:
        readmit = super().load_state_dict(state, prompts, step)
        self.tail.long_queue.extend(prompts[uid] for uid in state.get("long_queue", []))
        return readmit


class Lockstep:
    """Asynchrony by a fixed plan: step n's batch is generated by the versions ``LockstepPlan`` names.

    ``parts`` are the (step, part) admitted so far; ``admit`` adds every part the version the engines
    hold (or an older one) generates, then dynamic sampling's refills for the oldest unsettled batch only,
    so the prompts each batch draws do not depend on which group finished first. The rollout machine
    holds a publication until ``settled``.
    """

    def __init__(self, s: RolloutScheduler):
        self.s = s
        self.plan = s.spec.plan
        self.parts: set[tuple[int, int]] = set()

    def admit(self, step: int, draw: Draw) -> None:
        """What the plan gives the current version, and refills (``step`` is not needed: the plan knows)."""
        s, spec = self.s, self.s.spec
        for n, k, count in self.plan.due(s.version, s.taken):
            if (n, k) in self.parts:
                continue
            self.parts.add((n, k))
            if k == len(self.plan.parts(n)) - 1:  # the last part also makes up for the earlier parts' rejects
                count = spec.batch_groups - self._held(n)
            count = s.within_draws(n, count)
            if count > 0:
                s.launch(n, draw(count), spec.launched)
        for n in self._open_steps():
            if self._batch_settled(n):
                continue
            room = s.within_draws(n, spec.batch_groups - self._held(n))
            if room > 0:
                s.launch(n, draw(room), spec.launched)
            break  # later batches refill once this one has settled

    def _open_steps(self) -> list[int]:
        """Steps not yet taken whose parts are all admitted, in order."""
        steps = sorted({n for n, _ in self.parts})
        return [n for n in steps if all((n, k) in self.parts for k in range(len(self.plan.parts(n))))]

    def _held(self, step: int) -> int:
        return len(self.s.buffer.batch(step)) + self.s.in_flight(step)

    def _batch_settled(self, step: int) -> bool:
        """Full, or done drawing (dynamic sampling's rejects then complete it)."""
        s = self.s
        if len(s.buffer.batch(step)) >= s.spec.batch_groups:
            return True
        drawn_out = s.spec.max_draws is not None and s.drawn.get(step, 0) >= s.spec.max_draws
        return drawn_out and not s.in_flight(step)

    @property
    def settled(self) -> bool:
        """Nothing in flight and no batch waiting for a refill at the current version."""
        return not self.s.flights and all(self._batch_settled(n) for n in self._open_steps())

    def gauges(self) -> dict[str, float]:
        return {}

    def waiting(self) -> list[str]:
        return []

    def ready(self, step: int) -> bool:
        s, size = self.s, self.s.spec.batch_groups
        if len(s.buffer.batch(step)) < size and step in self._open_steps() and self._batch_settled(step):
            s.fall_back([e for e in s.filtered if e[1].admitted_for == step], lambda: len(s.buffer.batch(step)) >= size)
        return len(s.buffer.batch(step)) >= size

    def take(self, step: int) -> list[Group]:
        """The batch planned for ``step``; its draw count is the step's ``groups_admitted`` (counters since
        the last take would depend on how far ahead the rollout ran)."""
        s = self.s
        groups = s.buffer.take_batch(step, s.spec.batch_groups)
        drawn = s.drawn.get(step, 0)
        self.parts = {p for p in self.parts if p[0] > step}
        s.took(step, groups, keep_filtered=True)
        s.stats["rollout/groups_admitted"] = drawn
        return groups

    def state_dict(self) -> dict:
        """The committed groups themselves (saved settled: none may be in flight), since a resumed run no
        longer has the versions that generated them, with the plan's position."""
        s = self.s
        if not self.settled:
            raise RuntimeError("a lockstep rollout is saved settled: finish its groups in flight first")
        return {"admitted": [p.uid for p in s.requeued], "long_queue": [], "lockstep": {
            "taken": s.taken, "seq": s.seq, "parts": sorted(self.parts), "admitted_for": sorted(s.drawn.items()),
            "buffer": [[seq, g.to_dict()] for seq, g in s.buffer.entries],
            "filtered": [[seq, g.to_dict()] for seq, g in s.filtered]}}

    def load_state_dict(self, state: dict, prompts: dict[str, PromptRecord], step: int) -> list[PromptRecord]:
        planned, s = state.get("lockstep"), self.s
        kept = [Group.from_dict(g) for _, g in [*planned["buffer"], *planned["filtered"]]] if planned else []
        known(prompts, [*state.get("admitted", []), *state.get("long_queue", []), *(g.prompt.uid for g in kept)])
        s.taken = step
        if planned:
            s.taken, s.seq = planned["taken"], planned["seq"]
            self.parts = {tuple(p) for p in planned["parts"]}
            s.drawn = dict((int(n), c) for n, c in planned["admitted_for"])
            seqs = [seq for seq, _ in [*planned["buffer"], *planned["filtered"]]]
            entries = list(zip(seqs, kept, strict=True))
            s.buffer.entries = entries[:len(planned["buffer"])]
            s.filtered = entries[len(planned["buffer"]):]
        return [prompts[uid] for uid in state.get("admitted", [])]
