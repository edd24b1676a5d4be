"""Per-sample, asynchronous reward scoring over pools of reward workers, one pool per domain.

The driver submits samples as the rollout streams them back, so scoring overlaps generation; ``poll``
hands back the ones scored since the last poll (a driver loop that also waits on engines waits on
``refs()`` with them), and ``wait`` collects whatever is still in flight. The workers are Ray actors or
in-process ones (``RoleGroup.local_unplaced``), reached through ``gyre.cluster.transport``.

Each sample is scored on its own (its own deadline in the worker's child processes, its own
failure): a reward that raises or times out scores 0 and is counted.
Code domains with an adaptive timeout get a per-problem timeout on every request (RollPacker's
T = min(max(T_min, lambda * slowest correct run), T_max)), learned from earlier results.

Infrastructure faults never change a result. The calls of a worker actor that dies are re-sent to a
healthy worker of the domain or, when there is none, held until Ray has restarted it (a ping answers
again); when Ray gives up, a fresh actor replaces it. Every wait has a deadline: a worker with calls
in flight is pinged on a thread of its own that never queues behind ``score``, and a worker that does
not answer (stopped, wedged) or whose calls overrun what their samples' deadlines allow is killed and
replaced. A call is re-sent at most ``retries`` times; then ``wait`` raises ``RewardWorkerError``
naming the domain, the worker and the cause. Faults are counted (``metrics``).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Protocol

from gyre.cluster import transport
from gyre.cluster.group import RoleGroup
from gyre.cluster.transport import ActorLost, CallRaised, RemoteError
from gyre.cluster.workers import RewardWorker
from gyre.rewards.base import RewardRequest
from gyre.rewards.runner import CHILD_START_S, MAX_RERUNS, RunnerFaults, RunnerSpec, ScoreReply
from gyre.types import RewardResult, Trajectory

# Samples per remote call when a part of the rollout is split over a domain's workers: per-sample
# calls would cost a Ray round trip each; a few samples per call keep every worker busy.
_MIN_CALL = 4
# Pings in a row answered "actor died" after which a worker that should be restarting is taken for dead
# for good (one sent before Ray saw the death may get that answer although Ray restarts it).
_DEAD_PINGS = 2
# Fresh actors in a row that fail to start before the domain gives up.
_MAX_REPLACEMENTS = 2


class RewardScoring(Protocol):
    """What a reward domain's workers answer: ``RewardWorker`` (functions, in child processes) and
    ``ModelRewardWorker`` (a reward model)."""

    def score(self, requests: list[RewardRequest]) -> ScoreReply | list[RewardResult]:
        """Score these requests."""


class RewardWorkerError(RuntimeError):
    """A domain's reward workers kept failing: retries or replacements exhausted, or no worker left."""


@dataclass(frozen=True)
class PoolLimits:
    """How long the pool waits on its workers before it takes one for hung. The defaults allow for a
    loaded machine; tests shrink them."""

    start_s: float = 120.0
    """A worker actor's start or restart: Ray's worker process, imports, the reward function's import."""
    ping_s: float = 30.0
    """A started worker answers a ping within this (pings run on their own thread, beside ``score``)."""
    probe_every_s: float = 5.0
    """How often a worker with calls in flight is pinged."""
    model_call_s: float = 600.0
    """One call to a judge or reward-model worker (their config has no per-sample deadline)."""


@dataclass
class PoolFaults:
    """Infrastructure faults the pool survived, since it was made."""

    worker_deaths: int = 0
    """Worker actors that died: with calls in flight, or idle (Ray restarted them before any call saw it:
    found by the new process id of their next answer)."""
    worker_hangs: int = 0
    """Workers that stopped answering pings or overran their calls' deadline, and were killed."""
    worker_replacements: int = 0
    """Fresh actors started because Ray gave up restarting one, or one hung."""
    retried_samples: int = 0
    """Samples re-sent to a worker after a fault."""
    child_deaths: int = 0
    """Reward child processes that died (their sample was re-run on a fresh one)."""
    child_stops: int = 0
    """Reward child processes found stopped (killed and replaced; a sample they held was re-run)."""

    def add(self, runner: RunnerFaults) -> None:
        self.child_deaths += runner.child_deaths
        self.child_stops += runner.child_stops


def call_budget(deadlines: list[float], processes: int) -> float:
    """Most seconds a worker may spend on one call: each sample may run to its deadline after a fresh
    child's start-up and be re-run ``MAX_RERUNS`` times, and the runs are spread over ``processes``
    children (list scheduling: total work / processes + the longest run)."""
    runs = [d + CHILD_START_S for d in deadlines]
    return (1 + MAX_RERUNS) * (sum(runs) / processes + max(runs))


@dataclass
class _Worker:
    """The pool's view of one worker actor."""

    calls: int = 0
    """Calls in flight (least-loaded dispatch)."""
    busy_until: float = 0.0
    """When every call in flight must be done: their budgets, chained (an actor runs them one by one)."""
    started: bool = False
    """Answered since it was (re)started; until then a ping may wait for its start-up."""
    recovering: bool = False
    """Died or replaced: it gets no calls until a ping answers."""
    since: float = 0.0
    """When it started recovering."""
    gone: bool = False
    """Dead for good (a model worker the pool cannot replace)."""
    probe: object | None = None
    """The ObjectRef of the ping in flight."""
    probe_sent: float = 0.0
    next_ping: float = 0.0
    """When to ping it next (while it has calls in flight, or is recovering)."""
    dead_pings: int = 0
    """Pings in a row answered "actor died" while recovering (see ``_DEAD_PINGS``)."""
    replacements: int = 0
    """Fresh actors started in a row that have not answered yet."""
    pid: int | None = None
    """The process id of its last answer; None after a death or replacement the pool has counted."""

    @property
    def usable(self) -> bool:
        return not (self.recovering or self.gone)


@dataclass
class DomainScorer:
    """The workers of one reward domain."""

    name: str
    group: RoleGroup
    retries: int = 2
    """Re-sends of a call whose worker died or hung (``DomainConfig.retries``)."""
    adaptive: object | None = None
    """A ``gyre.rewards.code.AdaptiveTimeout`` for code domains with adaptive timeouts."""
    workers: list[_Worker] = field(default_factory=list)
    runner: RunnerSpec | None = None
    """How the workers run the reward function; None for judge and reward-model workers (no pings)."""
    held: list = field(default_factory=list)
    """Calls waiting for a worker to come back (every worker is restarting)."""

    def __post_init__(self) -> None:
        self.workers = [_Worker() for _ in self.group.actors]
        if self.runner is None and self.group.spawn_args is not None:
            self.runner = RunnerSpec(*self.group.spawn_args)


@dataclass
class _Call:
    scorer: DomainScorer
    samples: list[Trajectory]
    requests: list[RewardRequest]
    budget: float
    """Seconds the worker may spend on it (``call_budget``)."""
    worker: int = -1
    attempt: int = 0


class RewardPool:
    def __init__(self, scorers: dict[str, DomainScorer], limits: PoolLimits | None = None):
        self.scorers = scorers
        self.limits = limits or PoolLimits()
        self.faults = PoolFaults()
        self._calls: dict[object, _Call] = {}
        self._probes: dict[object, tuple[DomainScorer, int]] = {}
        self._scored: list[Trajectory] = []
        """Items that got their reward since the last ``poll``."""

    def submit(self, samples: list[Trajectory]) -> None:
        """Start scoring ``samples`` (each routed to its prompt's domain); returns at once."""
        by_domain: dict[str, list[Trajectory]] = {}
        for sample in samples:
            by_domain.setdefault(sample.prompt.domain, []).append(sample)
        for name, part in by_domain.items():
            scorer = self.scorers[name]
            size = max(_MIN_CALL, -(-len(part) // len(scorer.workers)))
            for start in range(0, len(part), size):
                chunk = part[start:start + size]
                requests = [self._request(scorer, s) for s in chunk]
                self._send(_Call(scorer, chunk, requests, self._budget(scorer, requests)))

    @property
    def busy(self) -> bool:
        """Some submitted item has no reward yet."""
        return bool(self._calls) or any(s.held for s in self.scorers.values())

    def refs(self) -> list:
        """The calls and pings in flight, for a driver that waits on them together with other work (e.g.
        rollout streams, with ``transport.wait``): when one is ready, ``poll(0)`` takes it in."""
        return [*self._calls, *self._probes]

    def poll(self, timeout: float = 0.0) -> list[Trajectory]:
        """The submitted items that got their ``reward`` since the last poll, in the order they got it;
        waits up to ``timeout`` seconds for one (0: only what is in now; ``math.inf``: until one is in or
        nothing is in flight). Each wait also checks the workers' health (pings, deadlines). Raises
        ``RewardWorkerError`` when a domain's workers keep failing (what was in flight is dropped)."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                self._step(min(1.0, self.limits.probe_every_s, max(0.0, deadline - time.monotonic())))
                if self._scored or not self.busy or time.monotonic() >= deadline:
                    break
        except RewardWorkerError:
            self._calls.clear()
            for scorer in self.scorers.values():
                scorer.held.clear()
            raise
        scored, self._scored = self._scored, []
        return scored

    def wait(self) -> list[Trajectory]:
        """Block until every submitted sample has its ``reward``; returns those not yet returned by
        ``poll``. Raises ``RewardWorkerError`` when a domain's workers keep failing."""
        scored = []
        while self.busy:
            scored += self.poll(math.inf)
        scored, self._scored = scored + self._scored, []
        return scored

    def score(self, samples: list[Trajectory]) -> None:
        self.submit(samples)
        self.wait()

    def _step(self, slice_s: float) -> None:
        """Wait up to ``slice_s`` for answers, take in every one that is in, then check the workers."""
        refs = self.refs()
        if not refs:  # only held calls, their worker's next ping not yet due
            time.sleep(slice_s)
        ready, rest = transport.wait(refs, num_returns=1, timeout=slice_s) if refs else ([], [])
        if ready and rest:  # every answer that is in, before any deadline is judged
            ready += transport.wait(rest, num_returns=len(rest), timeout=0)[0]
        for ref in ready:  # one answer may drop others (a lost worker's calls and ping)
            if ref in self._calls:
                self._settle_call(ref)
            elif ref in self._probes:
                self._settle_probe(ref)
        self._check_workers(time.monotonic())

    def metrics(self) -> dict[str, int]:
        """Fault counters since the pool was made, as ``fault/reward_<counter>`` (see ``PoolFaults``)."""
        return {f"fault/reward_{name}": value for name, value in asdict(self.faults).items()}

    def _request(self, scorer: DomainScorer, sample: Trajectory) -> RewardRequest:
        p = sample.prompt
        options = {}
        if scorer.adaptive is not None:
            options = {"timeout_s": scorer.adaptive.timeout_for(p.uid), "case_key": p.uid}
        # Rewards read the question as written; the chat-templated text is what the policy saw.
        return RewardRequest(sample.response_text, p.ground_truth, p.question or p.prompt_text, p.tag, options,
                             p.columns, p.messages)

    def _budget(self, scorer: DomainScorer, requests: list[RewardRequest]) -> float:
        if scorer.runner is None:
            return self.limits.model_call_s
        return call_budget(scorer.runner.deadlines(requests), scorer.runner.processes)

    # ---- calls ------------------------------------------------------------------------------------
    def _send(self, call: _Call) -> None:
        """To the least-loaded usable worker; held while every worker is restarting."""
        scorer = call.scorer
        usable = [i for i, w in enumerate(scorer.workers) if w.usable]
        if not usable:
            if not any(w.recovering for w in scorer.workers):
                raise RewardWorkerError(f"reward domain {scorer.name!r} has no worker left: all "
                                        f"{len(scorer.workers)} died and cannot be restarted by the reward pool")
            scorer.held.append(call)
            return
        call.worker = min(usable, key=lambda i: scorer.workers[i].calls)
        w, now = scorer.workers[call.worker], time.monotonic()
        start = w.busy_until if w.calls else now + (0.0 if w.started else self.limits.start_s)
        w.busy_until = max(start, now) + call.budget
        w.calls += 1
        self._calls[scorer.group.submit_to(call.worker, RewardScoring.score, call.requests)] = call

    def _settle_call(self, ref) -> None:
        call = self._calls.pop(ref)
        scorer, w = call.scorer, call.scorer.workers[call.worker]
        w.calls -= 1
        try:
            reply = transport.get(ref)
        except CallRaised as exc:  # score raised: the worker lives, the call is re-sent
            self._resend([call], f"worker {call.worker} failed a call ({_brief(exc)})")
            return
        except RemoteError as exc:
            self._lost(scorer, call.worker, f"died ({_brief(exc)})", hung=False, also=[call])
            return
        w.started = True
        results = reply.results if isinstance(reply, ScoreReply) else reply
        if isinstance(reply, ScoreReply):
            self.faults.add(reply.faults)
            self._answered(w, reply.pid)
        for sample, request, result in zip(call.samples, call.requests, results):
            sample.reward = result
            self._scored.append(sample)
            if scorer.adaptive is not None:
                scorer.adaptive.observe(request.options["case_key"], result)

    def _resend(self, calls: list[_Call], cause: str) -> None:
        for call in calls:
            if call.attempt >= call.scorer.retries:
                raise RewardWorkerError(_exhausted(call, cause))
            call.attempt += 1
            self.faults.retried_samples += len(call.samples)
            self._send(call)

    # ---- worker health ----------------------------------------------------------------------------
    def _lost(self, scorer: DomainScorer, index: int, cause: str, hung: bool, also: tuple | list = ()) -> None:
        """Worker ``index`` died or hung: re-send its calls elsewhere, and restart or replace it."""
        w = scorer.workers[index]
        calls = [*also, *(c for c in self._calls.values() if c.scorer is scorer and c.worker == index)]
        for ref in [r for r, c in self._calls.items() if c.scorer is scorer and c.worker == index]:
            del self._calls[ref]
        self._drop_probe(w)
        if hung:
            self.faults.worker_hangs += 1
        elif not w.recovering:
            self.faults.worker_deaths += 1
        w.calls, w.busy_until, w.pid = 0, 0.0, None
        if scorer.group.spawn is None:
            w.gone = True
            transport.kill(scorer.group.actors[index])
        elif hung:
            self._replace(scorer, index, cause)
        else:  # Ray restarts it (max_restarts); a ping answers once it is back
            self._recover(scorer, index)
        self._resend(calls, f"worker {index} {cause}")

    def _replace(self, scorer: DomainScorer, index: int, cause: str) -> None:
        w = scorer.workers[index]
        if w.replacements >= _MAX_REPLACEMENTS:
            raise RewardWorkerError(f"reward domain {scorer.name!r}: worker {index} {cause}, and {w.replacements} "
                                    "fresh workers in a row did not start either. Check that the reward function "
                                    "imports on every node and that the cluster has free CPUs for reward workers.")
        self._drop_probe(w)
        scorer.group.respawn(index)
        self.faults.worker_replacements += 1
        w.replacements += 1
        w.calls, w.busy_until, w.pid = 0, 0.0, None
        self._recover(scorer, index)

    def _recover(self, scorer: DomainScorer, index: int) -> None:
        """No calls for worker ``index`` until a ping answers (Ray restarting it, or a fresh actor starting)."""
        w = scorer.workers[index]
        w.recovering, w.started, w.dead_pings, w.since = True, False, 0, time.monotonic()
        self._ping(scorer, index)

    def _ping(self, scorer: DomainScorer, index: int) -> None:
        w = scorer.workers[index]
        ref = scorer.group.submit_to(index, RewardWorker.ping, probe=True)
        self._probes[ref] = (scorer, index)
        w.probe, w.probe_sent = ref, time.monotonic()

    def _drop_probe(self, w: _Worker) -> None:
        self._probes.pop(w.probe, None)
        w.probe = None

    def _settle_probe(self, ref) -> None:
        scorer, index = self._probes.pop(ref)
        w = scorer.workers[index]
        w.probe = None
        try:
            pid = transport.get(ref)
        except RemoteError as exc:
            if not w.recovering:
                self._lost(scorer, index, f"died ({_brief(exc)})", hung=False)
                return
            # Ray's own word for "may come back" is ActorUnavailableError; ask again a little later.
            w.dead_pings = 0 if isinstance(exc, ActorLost) and exc.restarting else w.dead_pings + 1
            w.next_ping = time.monotonic() + self.limits.probe_every_s
            if w.dead_pings >= _DEAD_PINGS:
                self._replace(scorer, index, f"was not restarted by Ray ({_brief(exc)})")
            return
        w.started, w.dead_pings = True, 0
        self._answered(w, pid)
        w.next_ping = time.monotonic() + self.limits.probe_every_s
        if w.recovering:
            w.recovering, w.replacements = False, 0
            held, scorer.held = scorer.held, []
            for call in held:
                self._send(call)

    def _answered(self, w: _Worker, pid: int) -> None:
        """A worker answered from process ``pid``: another process than its last answer's, with no death
        seen in between, means it died while idle and Ray restarted it before any call saw it."""
        if not isinstance(pid, int):  # a worker kind that does not say
            return
        if w.pid is not None and pid != w.pid:
            self.faults.worker_deaths += 1
        w.pid = pid

    def _check_workers(self, now: float) -> None:
        """Kill what is overdue; ping workers that have not answered lately."""
        lim = self.limits
        for scorer in self.scorers.values():
            for index, w in enumerate(scorer.workers):
                if w.recovering and now > w.since + lim.start_s:
                    self._replace(scorer, index, f"did not come back within {lim.start_s:g}s")
                elif w.usable and w.calls and now > w.busy_until:
                    self._lost(scorer, index, "ran past its calls' deadline", hung=True)
                elif w.usable and w.probe is not None and now > w.probe_sent + (lim.ping_s if w.started
                                                                               else lim.start_s):
                    self._lost(scorer, index, f"did not answer a ping within {lim.ping_s:g}s", hung=True)
                elif scorer.runner and w.probe is None and now >= w.next_ping:
                    self._ping(scorer, index)  # idle ones too: a death between calls is found (and counted)

    # ---- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {name: s.adaptive.to_dict() for name, s in self.scorers.items() if s.adaptive is not None}

    def load_state_dict(self, state: dict) -> None:
        for name, saved in state.items():
            scorer = self.scorers.get(name)
            if scorer is not None and scorer.adaptive is not None:
                scorer.adaptive = type(scorer.adaptive).from_dict(saved)


def _brief(exc: RemoteError) -> str:
    """The original error's type, first line and (Ray puts the reason there) last line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [""]
    text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return f"{exc.origin}: {text[:300]}"


def _exhausted(call: _Call, cause: str) -> str:
    s = call.scorer
    return (f"reward domain {s.name!r}: {cause} while scoring {len(call.samples)} samples, which had already "
            f"been re-sent {call.attempt} time(s) (reward.domains.{s.name}.retries={s.retries}). A reward function "
            "that kills or stops its own worker process does this, as do workers dying for outside reasons (out "
            "of memory, killed) more often than the budget allows: fix the function, or raise retries.")
