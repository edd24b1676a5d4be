"""A simulated rollout engine: gyre's engine protocol on a virtual clock, one cost model per device class.

It batches continuously: requests queue, join the running batch at a step boundary while there is a free
row (``max_rows``) and KV-cache room by the engine's own rule, which knows nothing of a sample's final
length (``EngineClass.admission``: gyre's HF engine reserves rows x the widest prompt + token budget, so
nothing is preempted; a paged engine admits while the tokens held now fit and, when the growing rows
outgrow the cache, preempts the newest row, which rejoins later and prefills what it held again), are
prefilled, and decode one token per row per step; ``abort`` hands back a sample's tokens so far; a weight
update suspends, loads and resumes, continuing rows under the new weights (their KV cache rebuilt: a
prefill of everything they hold) or, without partial rollouts, handing them back aborted.

A sample's length comes from the workload (``lengths(request, sample)``), so no token is sampled: between
two events (a row finishing, a request arriving, an abort, an update) the batch does not change, and
``advance`` jumps over all the steps in between at once, in closed form (``CostModel.decode_span_s``).
``step`` (one decoding step) implements the protocol's token-by-token contract and gives the same
results; a test holds the two to each other. For an engine whose cache is padded to the widest row (the HF
engine: ``EngineClass.padded_kv``) the cost model is given rows x the widest row's context instead of the
contexts' sum: it grows by the rows each step too, so the closed form holds.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from gyre.sim.cost import CostModel
from gyre.sim.tokens import Filler, VersionRuns
from gyre.types import GenerationRequest, GenerationResult, WeightVersion

_SLACK = 1e-9
"""Relative tolerance when comparing virtual times."""


@dataclass(eq=False)
class _SimRow:
    request: GenerationRequest
    sample: int
    target: int
    """Response tokens the sample ends with (prefix included), at most the token budget."""
    done0: int
    """Response tokens it held when it joined the batch (its prefix, or what it had at a resume)."""
    joined: int = -1
    """The engine's decoding step count when it joined (-1: still waiting)."""
    gone: bool = False
    """Aborted: its entry in the finish heap is stale."""
    earlier: tuple[tuple[WeightVersion, int], ...] = ()
    """Versions of the tokens it sampled here before a preemption (it rejoins as a new row)."""

    @property
    def reserve(self) -> int:
        """Prompt plus the token budget: the most KV cache it may need (all an engine knows in advance)."""
        return len(self.request.prompt_ids) + self.request.params.max_new_tokens


class SimEngine:
    def __init__(self, cost: CostModel, lengths: Callable[[GenerationRequest, int], int], max_rows: int | None = None,
                 now: float = 0.0):
        """``lengths(request, sample)``: the sample's full response length (its budget caps it);
        ``max_rows``: most sequences decoded together (None: as many as the KV cache holds)."""
        self.cost, self.lengths = cost, lengths
        self.max_rows = max_rows
        self.kv_tokens = cost.kv_capacity_tokens()
        self.now = now
        """The virtual time this engine has run to."""
        self.version: WeightVersion = 0
        self.suspended = False
        self.busy_s = 0.0
        """Seconds spent prefilling and decoding."""
        self.tokens = 0
        """Tokens decoded."""
        # Every row advances one token per step, so a row is described by the step it joined at: its
        # length, the batch's context sum and the next finish follow in O(1) / O(log n), not O(rows).
        self.steps = 0
        """Decoding steps run so far."""
        self.rows: dict[_SimRow, None] = {}
        """Rows decoding, in join order."""
        self.waiting: deque[_SimRow] = deque()
        self._finish: list[tuple[int, int, _SimRow]] = []
        """(step it finishes at, seq, row) of the decoding rows; aborted rows are skipped lazily."""
        self._seq = 0
        self._context = 0
        """Sum of the decoding rows' contexts (prompt + tokens so far)."""
        self._padded = cost.engine.padded_kv
        self._widest: list[tuple[int, int, _SimRow]] = []
        """Padded engines: (-(context - steps) at join, seq, row), a max-heap of the decoding rows' contexts
        (each grows by one a step, so their order holds); aborted and finished rows are skipped lazily."""
        self._reserves: dict[int, int] = {}
        """Reserving engines: how many decoding rows reserve each prompt + budget (the widest bounds the batch)."""
        self._reserve = cost.engine.admission == "reserve"
        self.preemptions = 0
        """Rows a paged engine preempted (their KV cache dropped, recomputed when they rejoin)."""
        self._history: list[tuple[int, WeightVersion]] = [(0, 0)]
        """(step, version) from which each loaded version decoded."""

    # ---- the protocol ------------------------------------------------------------------------------
    @property
    def weight_version(self) -> WeightVersion:
        return self.version

    @property
    def busy(self) -> bool:
        return bool(self.rows or self.waiting)

    def add(self, requests: Sequence[GenerationRequest]) -> None:
        for r in requests:
            for i in range(r.first_sample, r.first_sample + r.n):
                target = max(len(r.prefix) + 1, min(r.params.max_new_tokens, self.lengths(r, i)))
                self.waiting.append(_SimRow(r, i, target, len(r.prefix)))

    def request_ids(self) -> list[str]:
        return sorted({row.request.request_id for row in [*self.rows, *self.waiting]})

    def abort(self, request_ids: Sequence[str]) -> list[GenerationResult]:
        ids = set(request_ids)
        out = []
        for row in [row for row in self.rows if row.request.request_id in ids]:
            out.append(self._result(row, "abort"))
            self._remove(row)
        kept = deque()
        for row in self.waiting:
            if row.request.request_id in ids:
                out.append(self._result(row, "abort"))
            else:
                kept.append(row)
        self.waiting = kept
        return out

    def step(self) -> list[GenerationResult]:
        """One decoding step (admitting what fits first); the samples that finished."""
        if self.suspended:
            return []
        self._admit()
        while self._room() < 1:
            self._preempt()
        if not self.rows:
            return []
        self._decode(1)
        return self._finished()

    def suspend(self) -> None:
        self.suspended = True

    def resume(self) -> None:
        """Decode again; rows held across the suspension rebuild their KV cache (one prefill)."""
        if self.suspended and self.rows:
            self._spend(self.cost.prefill_s(self._context))
        self.suspended = False

    def load_weights(self, weights: Mapping | None, version: WeightVersion) -> None:
        if self.rows and not self.suspended:  # as a real engine: weights change between steps, suspended
            raise RuntimeError(f"the engine is decoding {len(self.rows)} rows: suspend it before loading weights")
        self.version = version
        if self._history[-1][0] == self.steps:
            self._history[-1] = (self.steps, version)
        else:
            self._history.append((self.steps, version))

    def load_adapter(self, adapter, version: WeightVersion) -> None:
        self.load_weights(None, version)

    def update(self, version: WeightVersion, partial: bool = True) -> list[GenerationResult]:
        """Suspend, load ``version`` (the sync's time), resume: what the engine loop does at a step boundary.
        Without ``partial``, every request it holds comes back aborted, queued ones too (as the engine
        loop aborts ``request_ids()``): the scheduler asks them again under the new weights."""
        self.suspend()
        dropped = [] if partial else self.abort(self.request_ids())
        self.now += self.cost.load_s()
        self.load_weights(None, version)
        self.resume()
        return dropped

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        out = [r for part in self.generate_stream(requests) for r in part]
        order = {r.request_id: k for k, r in enumerate(requests)}
        return sorted(out, key=lambda r: (order[r.request_id], r.sample_index))

    def generate_stream(self, requests: Sequence[GenerationRequest],
                        parts: int = 8) -> Iterator[list[GenerationResult]]:
        self.add(requests)
        while self.busy:
            done = self.advance(self.next_event())
            if done:
                yield done

    def offload(self) -> None:
        pass

    def reload(self) -> None:
        pass

    # ---- event skipping (what the simulator calls) ---------------------------------------------------
    def next_event(self) -> float:
        """When the next sample finishes, if nothing else happens meanwhile (inf when idle or suspended)."""
        if self.suspended or not self.busy:
            return float("inf")
        joining, admit_s = self._admission()
        rows = len(self.rows) + len(joining)
        contexts = [len(r.request.prompt_ids) + r.done0 for r in joining]
        if self._padded:
            context = rows * max([self._width(), *contexts])
        else:
            context = self._context + sum(contexts)
        left = min(([self._left()] if self.rows else []) + [r.target - r.done0 for r in joining])
        return self.now + admit_s + self.cost.decode_span_s(rows, context, left)

    def advance(self, until: float) -> list[GenerationResult]:
        """Run every whole step that ends by ``until``; the samples that finished meanwhile. Commands that
        arrive at ``until`` then take effect at the engine's next step boundary; an engine left idle waits
        there (its clock moves to ``until``)."""
        out: list[GenerationResult] = []
        slack = _SLACK * max(1.0, abs(until))
        while not self.suspended and self.busy:
            joining, admit_s = self._admission()
            if joining and self.now + admit_s > until + slack:
                break
            self._admit(joining, admit_s)
            if not self.rows:
                break
            room = self._room()
            if room < 1:  # the growing rows outgrew a paged cache: the newest gives its room back
                self._preempt()
                continue
            most = min(self._left(), room)
            # A hair of slack: the finish time ``next_event`` promised must not be missed by a rounding error.
            steps = self.cost.steps_within(len(self.rows), self._kv_context(), until - self.now + slack, most)
            if steps == 0:
                break
            self._decode(steps)
            out += self._finished()
            if steps < most:
                break
        if not self.busy and until != float("inf"):
            self.now = max(self.now, until)
        return out

    # ---- internals ----------------------------------------------------------------------------------
    def _done(self, row: _SimRow) -> int:
        return row.done0 if row.joined < 0 else row.done0 + self.steps - row.joined

    def _width(self) -> int:
        """The widest decoding row's context (0 without rows)."""
        while self._widest and self._widest[0][2].gone:
            heapq.heappop(self._widest)
        return -self._widest[0][0] + self.steps if self._widest else 0

    def _kv_context(self) -> int:
        """Context tokens a decoding step reads the KV cache of: the contexts' sum, or, padded, rows x the widest."""
        return len(self.rows) * self._width() if self._padded else self._context

    def _left(self) -> int:
        while self._finish and self._finish[0][2].gone:
            heapq.heappop(self._finish)
        return self._finish[0][0] - self.steps if self._finish else 0

    def _admission(self) -> tuple[list[_SimRow], float]:
        """The waiting rows that join at the next step boundary, and their prefill time. A row alone always
        joins (a real engine runs it, or fails it as too long)."""
        joining, rows = [], len(self.rows)
        # Paged: the next step must fit, the joining rows' tokens and one more token for every row (else a
        # row would join only to be preempted again at once).
        widest, held = max(self._reserves, default=0), self._context + rows
        for row in self.waiting:
            if self.max_rows is not None and rows >= self.max_rows:
                break
            if self._reserve:  # rows x the widest prompt + budget (the cache is padded to it)
                widest = max(widest, row.reserve)
                if rows and (rows + 1) * widest > self.kv_tokens:
                    break
            else:
                held += len(row.request.prompt_ids) + row.done0 + 1
                if rows and held > self.kv_tokens:
                    break
            joining.append(row)
            rows += 1
        return joining, self.cost.prefill_s(sum(len(r.request.prompt_ids) + r.done0 for r in joining))

    def _room(self) -> float:
        """Decoding steps the rows' KV cache still holds (a paged engine with several rows; else unbounded)."""
        if self._reserve or len(self.rows) < 2:
            return float("inf")
        return int((self.kv_tokens - self._context) // len(self.rows))

    def _preempt(self) -> None:
        """Drop the newest row's KV cache: it waits at the head of the queue and rejoins with what it holds."""
        row = next(reversed(self.rows))
        again = _SimRow(row.request, row.sample, row.target, self._done(row), earlier=tuple(self._runs(row)))
        self._remove(row)
        self.waiting.appendleft(again)
        self.preemptions += 1

    def _admit(self, joining: list[_SimRow] | None = None, seconds: float | None = None) -> None:
        if joining is None:
            joining, seconds = self._admission()
        for row in joining:
            self.waiting.popleft()
            row.joined = self.steps
            self.rows[row] = None
            self._seq += 1
            heapq.heappush(self._finish, (self.steps + row.target - row.done0, self._seq, row))
            self._context += len(row.request.prompt_ids) + row.done0
            if self._padded:
                heapq.heappush(self._widest, (self.steps - len(row.request.prompt_ids) - row.done0, self._seq, row))
            if self._reserve:
                self._reserves[row.reserve] = self._reserves.get(row.reserve, 0) + 1
        if joining:
            self._spend(seconds)

    def _remove(self, row: _SimRow) -> None:
        del self.rows[row]
        row.gone = True
        self._context -= len(row.request.prompt_ids) + self._done(row)
        if self._reserve:
            self._reserves[row.reserve] -= 1
            if not self._reserves[row.reserve]:
                del self._reserves[row.reserve]

    def _decode(self, steps: int) -> None:
        self._spend(self.cost.decode_span_s(len(self.rows), self._kv_context(), steps))
        self.steps += steps
        self._context += steps * len(self.rows)
        self.tokens += steps * len(self.rows)

    def _spend(self, seconds: float) -> None:
        self.now += seconds
        self.busy_s += seconds

    def _finished(self) -> list[GenerationResult]:
        out = []
        while self._finish and self._finish[0][0] <= self.steps:
            _, _, row = heapq.heappop(self._finish)
            if row.gone:
                continue
            reason = "length" if row.target >= row.request.params.max_new_tokens else "stop"
            out.append(self._result(row, reason))
            self._remove(row)
        return out

    def _runs(self, row: _SimRow) -> list[tuple[WeightVersion, int]]:
        """The versions of the tokens it sampled here: the load history over its decoding steps."""
        if row.joined < 0:
            return list(row.earlier)
        start, end, runs = row.joined, self.steps, list(row.earlier)
        for k, (at, version) in enumerate(self._history):
            nxt = self._history[k + 1][0] if k + 1 < len(self._history) else end
            lo, hi = max(at, start), min(nxt, end)
            if lo < hi:
                runs.append((version, hi - lo))
        return runs

    def _result(self, row: _SimRow, reason: str) -> GenerationResult:
        """What a row gives back: the tokens it sampled after its request's prefix, with their versions."""
        offset = len(row.request.prefix)
        runs = self._runs(row)
        n = self._done(row) - offset
        return GenerationResult(row.request.request_id, row.sample, row.request.prompt_ids, Filler(n), "",
                                Filler(n, 0.0), reason, VersionRuns(runs), offset=offset)
