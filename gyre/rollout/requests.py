"""Generation requests on engines: where each one runs, what each engine still owes, and the commands
that start and stop them. Sans-IO like the scheduler that owns it: ``assign`` and ``abort`` leave
``Generate`` / ``Abort`` commands in the shared outbox; the events come back through ``settle``.

Engines are loaded by outstanding work (samples x (prompt + token budget)); a lost engine gets nothing
until it is back, and ``lose`` hands back what it owed so the owner can ask the others.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gyre.rollout.assignment import assign_requests
from gyre.types import GenerationRequest, GenerationResult


@dataclass(frozen=True)
class Generate:
    """Command: generate ``requests`` on engine ``engine``."""

    engine: int
    requests: tuple[GenerationRequest, ...]


@dataclass(frozen=True)
class Abort:
    """Command: abort these requests (engine -> request ids); their unfinished samples come back aborted."""

    by_engine: dict[int, tuple[str, ...]]


@dataclass
class RequestBook:
    engines: int
    outbox: list
    """The owner's command list (shared)."""
    budget: int
    """Token budget of one sample (max new tokens), for the load estimate."""
    owner: dict[str, str] = field(default_factory=dict)
    """Live request id -> the key of what it belongs to (a group id)."""
    live: dict[str, tuple[int, set[int]]] = field(default_factory=dict)
    """Request id -> (engine, sample indices not yet back), until every sample is back (even aborted ones)."""
    load: list[int] = field(default_factory=list)
    down: set[int] = field(default_factory=set)
    """Engines lost and not yet replaced: nothing is assigned to them."""
    slots: int | None = None
    """Most samples an engine holds at once. None: every request goes to an engine when it is asked for
    (queued there behind what the engine has). A bound holds the rest here, in order, and hands each to
    the first engine with room as samples come back (ROLL Flash's queue scheduling: dispatch as capacity
    frees, so no request waits behind one engine's long tail while another idles)."""
    held: dict[str, GenerationRequest] = field(default_factory=dict)
    """Requests waiting for an engine with room (with ``slots``), in the order they were asked for."""
    count: list[int] = field(default_factory=list)
    """Samples each engine holds (with ``slots``)."""
    _open: list[tuple[int, int]] = field(default_factory=list)
    """Heap of (samples held, engine) with room (entries go stale; checked against ``count``)."""
    _owed: list[int] = field(default_factory=list)
    """Samples each engine owes (the sum over ``live``, kept as it changes: asked at every event)."""
    _held_samples: int = 0
    """Samples of the held requests."""

    def __post_init__(self) -> None:
        self.load = [0] * self.engines
        self.count = [0] * self.engines
        self._owed = [0] * self.engines
        self._open = [(0, e) for e in range(self.engines)]

    def _go_live(self, engine: int, r: GenerationRequest) -> None:
        before = self.live.get(r.request_id)
        if before is not None:  # asked again while live: what it owed before is replaced
            self._owed[before[0]] -= len(before[1])
        self.live[r.request_id] = (engine, set(range(r.first_sample, r.first_sample + r.n)))
        self._owed[engine] += r.n

    def assign(self, requests: Sequence[GenerationRequest], owner: Callable[[str], str],
               prefer: int | None = None) -> dict[str, int]:
        """Spread requests over engines on top of their outstanding work; ``owner(request id)`` names what
        each belongs to. Returns request id -> engine (-1: held until an engine has room). ``prefer``: one
        request goes to that engine when it is up and has room (an episode's next turn to the engine that
        holds its conversation's prefix in cache), else as any other."""
        if prefer is not None and len(requests) == 1 and self._can_take(prefer, requests[0].n):
            r = requests[0]
            self.owner[r.request_id] = owner(r.request_id)
            if self.slots is not None:
                self._place(prefer, r)
            else:
                self._go_live(prefer, r)
                self.load[prefer] += r.n * self._work(r.prompt_ids)
            self.outbox.append(Generate(prefer, (r,)))
            return {r.request_id: prefer}
        if self.slots is not None:
            for r in requests:
                self.owner[r.request_id] = owner(r.request_id)
                self.held[r.request_id] = r
                self._held_samples += r.n
            placed = {r.request_id: -1 for r in requests}
            placed.update(self._dispatch())
            return placed
        busy = 1 << 62  # a lost engine gets nothing while another is up
        loads = [busy if e in self.down and len(self.down) < self.engines else load for e, load in enumerate(self.load)]
        plan = assign_requests(list(requests), self.engines, loads)
        placed = {}
        for engine, idx in enumerate(plan):
            if not idx:
                continue
            mine = tuple(requests[i] for i in idx)
            for r in mine:
                self.owner[r.request_id] = owner(r.request_id)
                self._go_live(engine, r)
                self.load[engine] += r.n * self._work(r.prompt_ids)
                placed[r.request_id] = engine
            self.outbox.append(Generate(engine, mine))
        return placed

    def _can_take(self, engine: int, n: int) -> bool:
        if not 0 <= engine < self.engines or engine in self.down:
            return False
        return self.slots is None or not self.held and (self.count[engine] == 0 or self.count[engine] + n <= self.slots)

    def _dispatch(self) -> dict[str, int]:
        """Held requests to the engines with room, least-held first (lowest rank on ties), in order."""
        placed: dict[str, int] = {}
        by_engine: dict[int, list[GenerationRequest]] = {}
        while self.held:  # oldest first; only what is dispatched is looked at (thousands may be held)
            request_id, r = next(iter(self.held.items()))
            engine = self._room(r.n)
            if engine is None:
                break
            del self.held[request_id]
            self._held_samples -= r.n
            self._place(engine, r)
            by_engine.setdefault(engine, []).append(r)
            placed[request_id] = engine
        for engine, mine in by_engine.items():
            self.outbox.append(Generate(engine, tuple(mine)))
        return placed

    def _room(self, n: int) -> int | None:
        """The up engine holding the fewest samples, if it has room for ``n`` more (or holds none)."""
        while self._open:
            held, engine = self._open[0]
            if held != self.count[engine] or engine in self.down:
                heapq.heappop(self._open)  # stale: the engine's count changed, or it is down
                continue
            return engine if held == 0 or held + n <= self.slots else None
        return None

    def _place(self, engine: int, r: GenerationRequest) -> None:
        self._go_live(engine, r)
        self.load[engine] += r.n * self._work(r.prompt_ids)
        self._recount(engine, r.n)

    def _recount(self, engine: int, delta: int) -> None:
        self.count[engine] += delta
        heapq.heappush(self._open, (self.count[engine], engine))
        # Entries are only dropped when they reach the top: while every engine is full, each sample that
        # comes back leaves one behind, so a long run would grow the heap without bound. Rebuild it from
        # ``count`` (one entry per up engine) once it holds a few times that.
        if len(self._open) > 4 * self.engines + 64:
            self._open = [(c, e) for e, c in enumerate(self.count) if e not in self.down]
            heapq.heapify(self._open)

    def settle(self, result: GenerationResult) -> str | None:
        """A sample came back: its engine owes one less (and, with ``slots``, takes a held request).
        Returns the owner while the request is live."""
        live = self.live.get(result.request_id)
        if live is not None and result.sample_index in live[1]:
            self.load[live[0]] -= self._work(result.prompt_ids)
            live[1].discard(result.sample_index)
            self._owed[live[0]] -= 1
            if not live[1]:
                del self.live[result.request_id]
            if self.slots is not None:
                self._recount(live[0], -1)
                self._dispatch()
        return self.owner.get(result.request_id)

    def samples(self, request_id: str) -> set[int]:
        """The sample indices a live or held request still owes."""
        if request_id in self.held:
            r = self.held[request_id]
            return set(range(r.first_sample, r.first_sample + r.n))
        return self.live[request_id][1] if request_id in self.live else set()

    def abort(self, requests) -> None:
        """Abort these requests (ids) and forget them: held ones never start, live ones are stopped on their
        engines, and their late samples find no owner."""
        by_engine: dict[int, list[str]] = {}
        for request_id in requests:
            if request_id in self.live:  # finished requests have nothing left to abort
                by_engine.setdefault(self.live[request_id][0], []).append(request_id)
        if by_engine:
            self.outbox.append(Abort({e: tuple(ids) for e, ids in by_engine.items()}))
        self.forget(requests)

    def forget(self, request_ids) -> None:
        """Their late samples find no owner; held ones are dropped."""
        for request_id in request_ids:
            self.owner.pop(request_id, None)
            held = self.held.pop(request_id, None)
            if held is not None:
                self._held_samples -= held.n

    def lose(self, engine: int) -> list[tuple[str, str | None, list[int]]]:
        """Engine ``engine`` is gone with everything it held: (request id, owner, sample indices it still
        owed) for each of its requests; nothing new goes to it until ``back``."""
        self.down.add(engine)
        lost = [(rid, samples) for rid, (e, samples) in self.live.items() if e == engine]
        self.load[engine] = 0
        self.count[engine] = 0
        self._owed[engine] = 0
        out = []
        for rid, samples in lost:
            del self.live[rid]
            out.append((rid, self.owner.pop(rid, None), sorted(samples)))
        return out

    def owed(self, engine: int) -> int:
        """Samples engine ``engine`` still owes."""
        return self._owed[engine]

    def back(self, engine: int) -> None:
        self.down.discard(engine)
        self._recount(engine, 0)
        if self.slots is not None:
            self._dispatch()

    def grow(self) -> None:
        """One more engine (the next rank) takes requests from now on."""
        self.engines += 1
        self.load.append(0)
        self.count.append(0)
        self._owed.append(0)
        self._recount(self.engines - 1, 0)
        if self.slots is not None:
            self._dispatch()

    @property
    def outstanding(self) -> int:
        """Samples asked for and not yet back (aborted ones included until they are), held ones too."""
        return sum(self._owed) + self._held_samples

    def busy_engines(self) -> list[int]:
        """Engines that owe samples."""
        return [engine for engine, owed in enumerate(self._owed) if owed]

    def _work(self, prompt_ids: Sequence[int]) -> int:
        return len(prompt_ids) + self.budget
