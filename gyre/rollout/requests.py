"""Generation requests on engines: where each one runs, what each engine still owes, and the commands
that start and stop them. Sans-IO like the scheduler that owns it: ``assign`` and ``abort`` leave
``Generate`` / ``Abort`` commands in the shared outbox; the events come back through ``settle``.

Engines are loaded by outstanding work (samples x (prompt + token budget)); a lost engine gets nothing
until it is back, and ``lose`` hands back what it owed so the owner can ask the others.
"""

from __future__ import annotations

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

    def __post_init__(self) -> None:
        self.load = [0] * self.engines

    def assign(self, requests: Sequence[GenerationRequest], owner: Callable[[str], str]) -> dict[str, int]:
        """Spread requests over engines on top of their outstanding work; ``owner(request id)`` names what
        each belongs to. Returns request id -> engine."""
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
                self.live[r.request_id] = (engine, set(range(r.first_sample, r.first_sample + r.n)))
                self.load[engine] += r.n * self._work(r.prompt_ids)
                placed[r.request_id] = engine
            self.outbox.append(Generate(engine, mine))
        return placed

    def settle(self, result: GenerationResult) -> str | None:
        """A sample came back: its engine owes one less. Returns the owner while the request is live."""
        live = self.live.get(result.request_id)
        if live is not None and result.sample_index in live[1]:
            self.load[live[0]] -= self._work(result.prompt_ids)
            live[1].discard(result.sample_index)
            if not live[1]:
                del self.live[result.request_id]
        return self.owner.get(result.request_id)

    def abort(self, requests: dict[str, int]) -> None:
        """Abort the live ones among ``requests`` (id -> engine) and forget them: their late samples find
        no owner."""
        by_engine: dict[int, list[str]] = {}
        for request_id, engine in requests.items():
            if request_id in self.live:  # finished requests have nothing left to abort
                by_engine.setdefault(engine, []).append(request_id)
        if by_engine:
            self.outbox.append(Abort({e: tuple(ids) for e, ids in by_engine.items()}))
        self.forget(requests)

    def forget(self, request_ids) -> None:
        for request_id in request_ids:
            self.owner.pop(request_id, None)

    def lose(self, engine: int) -> list[tuple[str, str | None, list[int]]]:
        """Engine ``engine`` is gone with everything it held: (request id, owner, sample indices it still
        owed) for each of its requests; nothing new goes to it until ``back``."""
        self.down.add(engine)
        lost = [(rid, samples) for rid, (e, samples) in self.live.items() if e == engine]
        self.load[engine] = 0
        out = []
        for rid, samples in lost:
            del self.live[rid]
            out.append((rid, self.owner.pop(rid, None), sorted(samples)))
        return out

    def back(self, engine: int) -> None:
        self.down.discard(engine)

    def grow(self) -> None:
        """One more engine (the next rank) takes requests from now on."""
        self.engines += 1
        self.load.append(0)

    @property
    def outstanding(self) -> int:
        """Samples asked of engines and not yet back (aborted ones included until they are)."""
        return sum(len(samples) for _, samples in self.live.values())

    def busy_engines(self) -> list[int]:
        """Engines that owe samples."""
        return sorted({engine for engine, _ in self.live.values()})

    def _work(self, prompt_ids: Sequence[int]) -> int:
        return len(prompt_ids) + self.budget
