"""Where a group's samples come from: the scheduler's one interface to single-turn requests and episodes.

The scheduler owns every group's lifecycle (admit, accept samples, commit, abort, expire); a
``SampleSource`` owns how the samples of an admitted group are produced and what each engine result
means. ``SingleTurn`` asks engines for one response per sample (``gyre.rollout.requests``: one request
per group, or one per sample with prompt replication; a greedy response for ReMax's baseline; a sample
whose engine was lost is continued from the tokens it handed back, or regenerated from its seed). The
multi-turn ``EpisodeRunner`` (``gyre.rollout.episodes``) implements the same interface, a sample being
an episode on an environment. Sans-IO like the scheduler: both leave commands in the shared outbox.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from gyre.rollout.requests import RequestBook
from gyre.types import GREEDY_SAMPLE, GenerationRequest, GenerationResult, Group, Trajectory, WeightVersion

if TYPE_CHECKING:
    from gyre.rollout.spec import ScheduleSpec


@dataclass
class Outcome:
    """What environment answers finished: trajectories (group id, trajectory) and groups given up."""

    finished: list[tuple[str, Trajectory]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


@dataclass
class Flight:
    """An admitted group, not yet committed (the scheduler's record)."""

    group: Group
    seq: int
    """Admission order (the buffer keeps committed groups in it)."""
    step: int
    """The step it was admitted for."""
    launched: int
    """Samples asked for (more than the group's size when speculating)."""
    accepted: int = 0
    """Samples taken into the group so far (at most its size)."""


class SampleSource(Protocol):
    """How the samples of admitted groups are produced (``SingleTurn``, ``EpisodeRunner``)."""

    version: WeightVersion
    """The policy version the engines hold (the scheduler sets it at each publication)."""

    def bind(self, requests: RequestBook, outbox: list, stats: dict[str, float]) -> None:
        """Share the scheduler's request book, outbox and counters."""

    def launch(self, groups: Sequence[Group], samples: int) -> None:
        """Start producing ``samples`` samples of each newly admitted group (admitted together: single-turn
        requests are spread over the engines together)."""

    def on_generated(self, result: GenerationResult, flight: Flight | None) -> list[tuple[Trajectory, bool]]:
        """An engine result of ``flight`` (None: its group is gone). Returns the trajectories to score,
        each with whether it is one of the group's samples (False: a greedy baseline response)."""

    def on_env(self, results: list) -> Outcome:
        """Environments answered (multi-turn sources): the episodes that finished, the groups given up."""

    def on_lost(self, flight: Flight, request_id: str, samples: Sequence[int],
                handed_back: Mapping[tuple[str, int], GenerationResult]) -> None:
        """Request ``request_id``'s engine is gone owing ``samples``; ``handed_back``: tokens it returned."""

    def enough(self, group_id: str) -> None:
        """The group has its size of samples: stop producing more (speculative ones)."""

    def stop(self, group_id: str) -> None:
        """The group is aborted: stop everything of it."""

    def forget(self, group_id: str) -> None:
        """The group committed: results still on their way are waste."""

    def restart_stale(self, flight: Flight, oldest: WeightVersion) -> bool:
        """The group fell out of the staleness window: restart its samples that started before ``oldest``
        and keep the rest, returning True; False when this source cannot (the group is then aborted)."""

    @property
    def tokens_held(self) -> int:
        """Generated tokens kept outside the groups' trajectories (parts of samples being continued,
        turns of episodes still running): with them, every generated token is trained, held or wasted."""

    @property
    def pending(self) -> int:
        """Samples in progress that the request book does not count (episodes waiting on environments)."""


class SingleTurn:
    """Single-turn groups: each sample is one response to the prompt, asked of an engine as a request."""

    def __init__(self, spec: ScheduleSpec):
        self.spec = spec
        self.version: WeightVersion = 0
        self.requests: RequestBook | None = None
        self.outbox: list = []
        self.stats: dict[str, float] = {}
        self._live: dict[str, set[str]] = {}
        """Group id -> its live request ids (the request book knows where each runs)."""
        self._partial: dict[str, dict[int, Trajectory]] = {}
        """Group id -> sample index -> its tokens so far, while another engine continues it."""
        self._retries: dict[str, int] = {}
        """Group id -> requests asked again (their ids stay unique)."""
        self._launched: dict[str, int] = {}

    def bind(self, requests: RequestBook, outbox: list, stats: dict[str, float]) -> None:
        self.requests, self.outbox, self.stats = requests, outbox, stats

    @property
    def pending(self) -> int:
        return 0

    @property
    def tokens_held(self) -> int:
        return sum(len(t.response_ids) for parts in self._partial.values() for t in parts.values())

    def launch(self, groups: Sequence[Group], samples: int) -> None:
        s, requests = self.spec, []
        for group in groups:
            gid = group.group_id
            self._live[gid], self._partial[gid], self._retries[gid] = set(), {}, 0
            self._launched[gid] = samples
            if s.replicate:
                requests += [self._request(group, f"{gid}/{j}", j, 1) for j in range(samples)]
            else:
                requests.append(self._request(group, gid, 0, samples))
            if s.greedy:
                requests.append(self._request(group, f"{gid}/greedy", GREEDY_SAMPLE, 1))
        self._assign(requests)

    def on_generated(self, result: GenerationResult, flight: Flight | None) -> list[tuple[Trajectory, bool]]:
        r = result
        if r.sample_index == GREEDY_SAMPLE:
            return self._on_greedy(flight, r)
        if flight is None or flight.accepted >= flight.group.size:
            self._count("rollout/samples_aborted")  # its group was aborted, or had enough samples
            self._count("rollout/tokens_wasted", len(r.response_ids))
            return []
        gid = flight.group.group_id
        if r.finish_reason == "abort":  # the engine dropped it (a weight update without partial rollouts)
            self._count("rollout/tokens_wasted", len(r.response_ids) + r.offset)
            self._partial[gid].pop(r.sample_index, None)
            self._retry(flight.group, r.sample_index)
            return []
        if not r.offset:
            return [(Trajectory.from_result(flight.group.prompt, r), True)]
        t = self._partial[gid].pop(r.sample_index)  # the finished sample, after the parts it continues
        t.extend(r)
        t.status = "generated"
        return [(t, True)]

    def _on_greedy(self, flight: Flight | None, r: GenerationResult) -> list[tuple[Trajectory, bool]]:
        """A group's greedy response came back: kept to be scored (asked again if the engine dropped it)."""
        if flight is None or flight.group.greedy is not None or r.finish_reason == "abort":
            self._count("rollout/tokens_wasted", len(r.response_ids))
            if flight is not None and flight.group.greedy is None:  # dropped by a weight update: ask again
                self._retry(flight.group, GREEDY_SAMPLE)
            return []
        flight.group.greedy = Trajectory.from_result(flight.group.prompt, r)
        self._count("rollout/greedy_samples")
        return [(flight.group.greedy, False)]

    def on_env(self, results: list) -> Outcome:
        raise TypeError("single-turn groups call no environment")

    def on_lost(self, flight: Flight, request_id: str, samples: Sequence[int],
                handed_back: Mapping[tuple[str, int], GenerationResult]) -> None:
        """Each sample is continued from what the engine handed back, or from its earlier parts, else
        regenerated from its seed (the same tokens under the same weights)."""
        group, gid = flight.group, flight.group.group_id
        self._live[gid].discard(request_id)
        for i in samples:
            part = handed_back.get((request_id, i))
            if part is not None and i != GREEDY_SAMPLE and (part.response_ids or part.offset):
                self._continue(group, part)
                self._count("rollout/samples_continued")
            elif i in self._partial[gid]:  # nothing handed back, but the tokens of its earlier parts are here
                self._ask_rest(group, i)
                self._count("rollout/samples_continued")
            else:
                self._retry(group, i)
                self._count("rollout/samples_requeued")

    def enough(self, group_id: str) -> None:
        """Abort the group's sampling requests still out (speculation); its greedy response, if still out,
        goes on."""
        group_size = self.spec.group_size
        if self._launched.get(group_id, 0) <= group_size:
            return
        live = self._live[group_id]
        spare = {rid for rid in live if GREEDY_SAMPLE not in self.requests.samples(rid)}
        self.requests.abort(spare)
        live -= spare

    def stop(self, group_id: str) -> None:
        self.requests.abort(self._live.get(group_id, ()))
        self._drop(group_id)

    def forget(self, group_id: str) -> None:
        self.requests.forget(self._live.get(group_id, ()))
        self._drop(group_id)

    def restart_stale(self, flight: Flight, oldest: WeightVersion) -> bool:
        return False

    # ---- internals ------------------------------------------------------------------------------
    def _drop(self, group_id: str) -> None:
        """The group ended: parts of samples it no longer needs are waste."""
        leftover = self._partial.get(group_id, {})
        self._count("rollout/tokens_wasted", sum(len(t.response_ids) for t in leftover.values()))
        for book in (self._live, self._partial, self._retries, self._launched):
            book.pop(group_id, None)

    def _request(self, group: Group, request_id: str, first: int, n: int) -> GenerationRequest:
        params = replace(self.spec.sampling, temperature=0.0) if first == GREEDY_SAMPLE else self.spec.sampling
        return GenerationRequest(request_id, group.prompt.prompt_ids, params, n=n, seed=group.seed, first_sample=first)

    def _assign(self, requests: list[GenerationRequest]) -> None:
        """Spread requests over engines on top of their outstanding work (prompt + budget per sample)."""
        placed = self.requests.assign(requests, lambda request_id: request_id.split("/")[0])
        for request_id in placed:
            self._live[request_id.split("/")[0]].add(request_id)

    def _retry(self, group: Group, sample_index: int) -> None:
        """Regenerate a sample from scratch under the current weights (same seed, same stream: under the
        same weights it comes out as the lost one would have)."""
        retries = self._retries[group.group_id] = self._retries[group.group_id] + 1
        self._assign([self._request(group, f"{group.group_id}/{sample_index}.{retries}", sample_index, 1)])

    def _continue(self, group: Group, part: GenerationResult) -> None:
        """Ask another engine to go on with a sample from the tokens ``part`` holds (appended to what
        earlier parts of it gave)."""
        i, partial = part.sample_index, self._partial[group.group_id]
        t = partial.get(i)
        if t is None or part.offset == 0:
            partial[i] = Trajectory.from_result(group.prompt, part)
        else:
            t.extend(part)
        self._ask_rest(group, i)

    def _ask_rest(self, group: Group, i: int) -> None:
        """Ask an engine for the rest of sample ``i`` after the tokens its parts so far gave."""
        t = self._partial[group.group_id][i]
        retries = self._retries[group.group_id] = self._retries[group.group_id] + 1
        prefix = tuple(itertools.chain.from_iterable(s.token_ids for s in t.segments))
        request = replace(self._request(group, f"{group.group_id}/{i}.{retries}", i, 1), prefix=prefix)
        self._assign([request])

    def _count(self, key: str, value: float = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + value
