"""Multi-turn groups for the rollout scheduler: each sample is an episode on an environment slot.

Sans-IO like the scheduler: ``EnvCall`` commands (reset a slot to a seed, step it with an action) and
turn requests (through the scheduler's ``RequestBook``) go to the outbox; ``EnvResult`` events and
engine results come back. There is no barrier across environments: each episode asks for its next
turn as soon as its environment answers, and its environment gets the action as soon as the turn is
sampled (ROLL Flash's environment-level asynchrony).

All episodes of a group play the same environment seed (their returns are comparable, GRPO style),
each with its own sampling streams. An environment that fails (raises, hangs, crashes, returns junk)
costs its episode, which is counted (``env/failures_<kind>``) and replaced by a fresh one of the same
group on the same seed, at most ``max_failures`` times per group; past that the group is given up
(``failed``) and the scheduler admits another in its place. The first failure of each kind is logged
with its message. An environment that fails every episode would have groups given up forever: once
``max(GIVE_UP_LIMIT, slots)`` groups in a row are given up with no episode finishing, the run stops
(``EnvError``, with the last failure). Observations cut to the episode's limit are counted too
(``env/observations_cut``).

``turn_sync`` turns this into classic turn-synchronised batching, the baseline environment-level
asynchrony is measured against: every running episode's next turn is sampled together once every
environment has answered, and the environments are stepped together once every turn is sampled.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gyre.envs.calls import EnvCall, EnvResult, SlotPool
from gyre.envs.context import ContextBuilder
from gyre.envs.episode import Episode, EpisodeLimits
from gyre.envs.protocol import EnvError, EnvFailure, EnvReset
from gyre.rollout.requests import RequestBook
from gyre.rollout.samples import Flight, Outcome
from gyre.seeding import derive_seed
from gyre.types import GenerationResult, Group, SamplingParams, Trajectory, WeightVersion

log = logging.getLogger(__name__)

GIVE_UP_LIMIT = 8
"""Groups given up in a row (no episode finishing meanwhile) that stop the run, or the slot count if
larger: one lost environment worker may fail every episode in flight at once."""


@dataclass
class _Live:
    episode: Episode
    group: str
    slot: int | None = None
    calls: int = 0
    request: str | None = None
    """Its turn being sampled, if any."""
    in_env: bool = False
    """An environment call of it is outstanding."""
    started: WeightVersion | None = None
    """The policy version when its first turn was asked for (its start version: staleness counts from it)."""
    engine: int | None = None
    """The engine its last turn went to: the next goes there too while it has room (its prefix is cached)."""
    samples: dict[int, GenerationResult] = field(default_factory=dict)
    """Its turn's samples back so far (a turn asking ``n`` > 1 steps its environment once all are back)."""


class EpisodeRunner:
    """The multi-turn ``SampleSource`` (``gyre.rollout.samples``): each sample of a group is an episode."""

    def __init__(self, slots: SlotPool, builder: ContextBuilder, limits: EpisodeLimits, sampling: SamplingParams,
                 env_seed: Callable[[Group], int] | None = None, max_failures: int = 3, turn_sync: bool = False):
        """``env_seed(group)``: the environment seed its episodes play (default: from the group's seed);
        ``turn_sync``: barriers between turns (see the module docstring)."""
        self.slots, self.builder, self.limits, self.sampling = slots, builder, limits, sampling
        self.env_seed = env_seed or (lambda g: derive_seed(g.seed, "env") % (2 ** 31))
        self.max_failures = max_failures
        self.live: dict[str, _Live] = {}
        """Episode key -> its state."""
        self.waiting: deque[str] = deque()
        """Episodes waiting for a slot, in launch order."""
        self.failures: dict[str, int] = {}
        """Group id -> episodes lost to environment failures."""
        self.given_up_in_a_row = 0
        """Groups given up since an episode last finished."""
        self.last_failure: EnvFailure | None = None
        self._logged: set[str] = set()
        """Failure kinds whose first failure was logged."""
        self.next_index: dict[str, int] = {}
        self.groups: dict[str, Group] = {}
        self.requests: RequestBook | None = None
        self.outbox: list = []
        self.stats: dict[str, float] = {}
        self.turn_sync = turn_sync
        self.version: WeightVersion = 0
        """The policy version the engines hold (set by the scheduler)."""
        self._held_turns: list = []
        self._held_steps: list = []

    def bind(self, requests: RequestBook, outbox: list, stats: dict[str, float]) -> None:
        """Share the scheduler's request book, outbox and counters."""
        self.requests, self.outbox, self.stats = requests, outbox, stats

    # ---- the scheduler's calls ---------------------------------------------------------------------
    def launch(self, groups: Sequence[Group], samples: int) -> None:
        """Start ``samples`` episodes of each group (those without a free slot wait for one)."""
        for group in groups:
            self.groups[group.group_id] = group
            self.next_index.setdefault(group.group_id, 0)
            for _ in range(samples):
                self._new_episode(group)
            self._start_waiting()

    def stop(self, group_id: str) -> None:
        """The group needs no more episodes: abort their turns, free their slots."""
        for key in [k for k, live in self.live.items() if live.group == group_id]:
            self._drop(key)
        self.waiting = deque(k for k in self.waiting if k in self.live)
        self.groups.pop(group_id, None)
        self.failures.pop(group_id, None)
        self._start_waiting()
        self._pass_barriers()

    # ---- the sample source's calls (``gyre.rollout.samples.SampleSource``) -------------------------
    @property
    def pending(self) -> int:
        """Episodes running or waiting for a slot (their turns in the request book are counted there too)."""
        return len(self.live)

    @property
    def tokens_held(self) -> int:
        """Sampled tokens of running episodes: recorded, a turn's choices waiting for the environment's pick,
        and a turn's samples back before the others."""
        return sum(sum(len(s.token_ids) for s in live.episode.segments if s.trainable) + live.episode.unrecorded
                   + sum(len(r.response_ids) for r in live.samples.values()) for live in self.live.values())

    def on_generated(self, result: GenerationResult, flight: Flight | None) -> list[tuple[Trajectory, bool]]:
        """A turn came back: the episode goes on (it finishes when its environment says so, ``on_env``)."""
        if flight is None:
            self._count("rollout/tokens_wasted", len(result.response_ids))
        else:
            self.on_turn(result)
        return []

    def on_lost(self, flight: Flight, request_id: str, samples: Sequence[int],
                handed_back: Mapping[tuple[str, int], GenerationResult]) -> None:
        """The turn's engine is gone: the turn is asked again from the episode's context (what the engine
        handed back of it is waste: the turn's samples come again, together)."""
        self._count("rollout/tokens_wasted", sum(len(r.response_ids) for (rid, _), r in handed_back.items()
                                                 if rid == request_id))
        self.retry_turn(request_id)

    def enough(self, group_id: str) -> None:
        self.stop(group_id)  # redundant episodes no longer needed

    def forget(self, group_id: str) -> None:
        """Nothing to do: a group commits once ``enough`` stopped its other episodes."""

    def restart_stale(self, flight: Flight, oldest: WeightVersion) -> bool:
        """Keep the group's episodes that started at ``oldest`` or later, restart the others from reset
        under the current weights (their finished trajectories are dropped and counted as waste)."""
        group = flight.group
        stale = [t for t in group.trajectories if t.weight_version < oldest]
        group.trajectories = [t for t in group.trajectories if t.weight_version >= oldest]
        flight.accepted = len(group.trajectories)
        self._count("rollout/tokens_wasted", sum(len(s.token_ids) for t in stale for s in t.segments if s.trainable))
        restarted = self.restart(group, oldest, replace=len(stale))
        self._count("env/episodes_restarted", len(stale) + restarted)
        group.admitted_version = min([t.weight_version for t in group.trajectories]
                                     + self.start_versions(group.group_id) + [self.version])
        return True

    def restart(self, group: Group, oldest: WeightVersion, replace: int = 0) -> int:
        """Restart the group's running episodes that started before ``oldest`` (from reset, on the same
        environment seed, under the current weights) and launch ``replace`` more; returns how many restarted."""
        stale = [k for k, live in self.live.items()
                 if live.group == group.group_id and live.started is not None and live.started < oldest]
        for key in stale:
            self._drop(key)
        self.waiting = deque(k for k in self.waiting if k in self.live)
        self.launch([group], len(stale) + replace)
        self._pass_barriers()
        return len(stale)

    def start_versions(self, group_id: str) -> list[WeightVersion]:
        """Start versions of the group's running episodes that have asked for a turn."""
        return [live.started for live in self.live.values() if live.group == group_id and live.started is not None]

    def on_env(self, results: list[EnvResult]) -> Outcome:
        out = Outcome()
        for result in results:
            key = result.call_id.rpartition("@")[0]
            live = self.live.get(key)
            if live is None:
                continue  # its group was stopped meanwhile
            value = result.value
            live.in_env = False
            if isinstance(value, EnvFailure):
                self._report(value)
                self._fail(key, out)
            else:
                reset = isinstance(value, EnvReset)
                if not reset:
                    self._count("env/steps")
                try:
                    request = live.episode.on_reset(value) if reset else live.episode.on_step(value)
                except EnvError as exc:  # messages the chat template cannot render; a step naming no valid choice
                    self._report(EnvFailure("invalid", str(exc)))
                    self._fail(key, out)
                    continue
                if live.episode.wasted:  # the choices a step did not take
                    self._count("rollout/tokens_wasted", live.episode.wasted)
                    live.episode.wasted = 0
                if request is None:
                    self._finish(key, out)
                else:
                    self._ask(key, request)
        self._start_waiting()
        self._pass_barriers()
        return out

    def on_turn(self, result: GenerationResult) -> None:
        """A turn came back from an engine (its request already settled in the book)."""
        key = result.request_id.rpartition("#")[0]
        live = self.live.get(key)
        if live is None or live.request != result.request_id:  # its episode ended, or a copy of a turn asked
            self._count("rollout/tokens_wasted", len(result.response_ids))  # again came back first: waste
            return
        live.samples[result.sample_index] = result
        if len(live.samples) < live.episode.samples:
            return  # the turn's other samples are still being sampled
        results = [live.samples[i] for i in sorted(live.samples)]
        live.request, live.samples = None, {}
        if any(r.finish_reason == "abort" for r in results):  # a weight update without partial rollouts
            self._count("rollout/tokens_wasted", sum(len(r.response_ids) for r in results))
            self._ask(key, live.episode.request(), again=True)  # dropped it: ask again
        else:
            self._call(key, "step", live.episode.on_turns(results))
        self._pass_barriers()

    def retry_turn(self, request_id: str) -> None:
        """Its engine was lost: ask for the turn again (same stream: the same tokens under the same weights)."""
        key = request_id.rpartition("#")[0]
        live = self.live.get(key)
        if live is not None and live.request == request_id:
            self._count("rollout/tokens_wasted", sum(len(r.response_ids) for r in live.samples.values()))
            live.request, live.samples = None, {}  # the turn's samples come again, together
            self._ask(key, live.episode.request(), again=True)
            self._count("rollout/samples_requeued")
            self._pass_barriers()  # turn-synchronised: a held turn must not wait for an event that never comes

    # ---- internals ----------------------------------------------------------------------------
    def _new_episode(self, group: Group) -> None:
        index = self.next_index[group.group_id]
        self.next_index[group.group_id] = index + 1
        key = f"{group.group_id}/{index}"
        episode = Episode(key, group.prompt, index, group.seed, self.limits, self.sampling, self.builder)
        self.live[key] = _Live(episode, group.group_id)
        self.waiting.append(key)

    def _start_waiting(self) -> None:
        while self.waiting and self.slots.free:
            key = self.waiting.popleft()
            live = self.live.get(key)
            if live is None:
                continue
            live.slot = self.slots.free.popleft()
            self._call(key, "reset", self.env_seed(self.groups[live.group]))

    def _call(self, key: str, op: str, arg) -> None:
        live = self.live[key]
        live.calls += 1
        call = EnvCall(live.slot, f"{key}@{live.calls}", op, arg)
        if self.turn_sync and op == "step":
            self._held_steps.append((key, call))
            return
        live.in_env = True
        self.outbox.append(call)

    def _ask(self, key: str, request, again: bool = False) -> None:
        """Ask for the episode's turn; turn-synchronised, a new turn waits for the barrier, while a turn asked
        ``again`` (lost, or aborted by a weight update) belongs to the sampling phase under way."""
        live = self.live[key]
        if live.started is None:
            live.started = self.version
        if self.turn_sync and not again:
            self._held_turns.append((key, request))
            return
        live.request = request.request_id
        placed = self.requests.assign([request], lambda request_id: live.group, prefer=live.engine)
        live.engine = placed[request.request_id] if placed[request.request_id] >= 0 else live.engine

    def _pass_barriers(self) -> None:
        """Turn-synchronised batching: turns go together once no environment is busy, steps together once
        no turn is being sampled."""
        if not self.turn_sync:
            return
        held_turns = [(k, r) for k, r in self._held_turns if k in self.live]
        held_steps = [(k, c) for k, c in self._held_steps if k in self.live]
        busy_env = any(live.in_env for live in self.live.values())
        sampling = any(live.request is not None for live in self.live.values())
        if held_steps and not sampling and not held_turns:
            self._held_steps = []
            for key, call in held_steps:
                self.live[key].in_env = True
                self.outbox.append(call)
        elif held_turns and not busy_env and not held_steps:
            self._held_turns = []
            for key, request in held_turns:
                live = self.live[key]
                live.request = request.request_id
                self.requests.assign([request], lambda request_id, g=live.group: g)
        else:
            self._held_turns, self._held_steps = held_turns, held_steps

    def _finish(self, key: str, out: Outcome) -> None:
        live = self.live[key]
        out.finished.append((live.group, live.episode.trajectory()))
        self._count("env/observations_cut", live.episode.info.get("observations_cut", 0))
        for k, v in live.episode.info.items():
            if k.startswith("agent/"):
                self._count(k, v)
        self.given_up_in_a_row = 0
        self._release(key)

    def _report(self, failure: EnvFailure) -> None:
        """Count the failure; log the first of its kind with its message (the rest are only counted)."""
        self._count(f"env/failures_{failure.kind}")
        self.last_failure = failure
        if failure.kind not in self._logged:
            self._logged.add(failure.kind)
            log.warning("an environment failed (%s): %s. Its episode is replaced; failures are counted in "
                        "env/failures_%s, and only the first of each kind is shown", failure.kind, failure.message,
                        failure.kind)

    def _fail(self, key: str, out: Outcome) -> None:
        """An environment failure: a fresh episode of the group replaces this one, or the group is given up."""
        group_id = self.live[key].group
        self._waste(self.live[key])
        self._release(key)
        lost = self.failures[group_id] = self.failures.get(group_id, 0) + 1
        if lost > self.max_failures:
            out.failed.append(group_id)
            self._count("env/groups_failed")
            self.given_up_in_a_row += 1
            if self.given_up_in_a_row >= max(GIVE_UP_LIMIT, self.slots.size):
                raise EnvError(f"the environment failed every episode of the last {self.given_up_in_a_row} groups "
                               f"(each given up after env.max_failures = {self.max_failures} failures); the last "
                               f"({self.last_failure.kind}): {self.last_failure.message}. Fix the environment, or "
                               f"raise env.step_timeout_s / env.reset_timeout_s if it is only slow")
        elif group_id in self.groups:
            self._new_episode(self.groups[group_id])

    def _drop(self, key: str) -> None:
        live = self.live[key]
        if live.request is not None:
            self.requests.abort([live.request])
        self._waste(live)
        self._release(key)

    def _waste(self, live: _Live) -> None:
        """An episode ends untrained (stopped, restarted, or its environment failed): its turns so far are waste."""
        episode = live.episode
        self._count("rollout/tokens_wasted", sum(len(s.token_ids) for s in episode.segments if s.trainable)
                    + episode.unrecorded + sum(len(r.response_ids) for r in live.samples.values()))

    def _release(self, key: str) -> None:
        live = self.live.pop(key)
        if live.slot is not None:
            self.slots.free.append(live.slot)

    def _count(self, name: str, value: float = 1) -> None:
        self.stats[name] = self.stats.get(name, 0) + value
