"""Per-sample, asynchronous reward scoring over pools of Ray reward workers, one pool per domain.

The driver submits samples as the rollout streams them back, so scoring overlaps generation; ``wait``
then collects whatever is still in flight. Each sample is scored on its own (its own deadline in the
worker's child processes, its own failure): a reward that raises or times out scores 0 and is counted,
and a worker that dies is restarted by Ray while its samples are retried on another worker, up to the
domain's ``retries``. Code domains with an adaptive timeout get a per-problem timeout on every request
(RollPacker's T = min(max(T_min, lambda * slowest correct run), T_max)), learned from earlier results.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gyre.cluster.group import RoleGroup
from gyre.rewards.base import RewardRequest
from gyre.types import RewardResult, Sample

# Samples per remote call when a part of the rollout is split over a domain's workers: per-sample
# calls would cost a Ray round trip each; a few samples per call keep every worker busy.
_MIN_CALL = 4


@dataclass
class DomainScorer:
    """The workers of one reward domain."""

    name: str
    group: RoleGroup
    retries: int = 1
    adaptive: object | None = None
    """A ``gyre.rewards.code.AdaptiveTimeout`` for code domains with adaptive timeouts."""
    inflight: list[int] = field(default_factory=list)
    """Calls in flight per worker (least-loaded dispatch)."""

    def __post_init__(self) -> None:
        self.inflight = [0] * len(self.group)


@dataclass
class _Call:
    scorer: DomainScorer
    worker: int
    samples: list[Sample]
    requests: list[RewardRequest]
    attempt: int


class RewardPool:
    def __init__(self, scorers: dict[str, DomainScorer]):
        self.scorers = scorers
        self._calls: dict[object, _Call] = {}

    def submit(self, samples: list[Sample]) -> None:
        """Start scoring ``samples`` (each routed to its prompt's domain); returns at once."""
        by_domain: dict[str, list[Sample]] = {}
        for sample in samples:
            by_domain.setdefault(sample.prompt.domain, []).append(sample)
        for name, part in by_domain.items():
            scorer = self.scorers[name]
            size = max(_MIN_CALL, -(-len(part) // len(scorer.group)))
            for start in range(0, len(part), size):
                chunk = part[start:start + size]
                self._send(scorer, chunk, [self._request(scorer, s) for s in chunk], attempt=0)

    def wait(self) -> None:
        """Block until every submitted sample has its ``reward``."""
        import ray

        while self._calls:
            ready, _ = ray.wait(list(self._calls), num_returns=1)
            call = self._calls.pop(ready[0])
            call.scorer.inflight[call.worker] -= 1
            try:
                results = ray.get(ready[0])
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
                self._retry_or_fail(call, exc)
                continue
            for sample, request, result in zip(call.samples, call.requests, results):
                sample.reward = result
                if call.scorer.adaptive is not None:
                    call.scorer.adaptive.observe(request.options["case_key"], result)

    def score(self, samples: list[Sample]) -> None:
        self.submit(samples)
        self.wait()

    def _request(self, scorer: DomainScorer, sample: Sample) -> RewardRequest:
        p = sample.prompt
        options = {}
        if scorer.adaptive is not None:
            options = {"timeout_s": scorer.adaptive.timeout_for(p.uid), "case_key": p.uid}
        # Rewards read the question as written; the chat-templated text is what the policy saw.
        return RewardRequest(sample.result.response_text, p.ground_truth, p.question or p.prompt_text, p.tag, options)

    def _send(self, scorer: DomainScorer, samples: list[Sample], requests: list[RewardRequest], attempt: int,
              avoid: int | None = None) -> None:
        choices = [w for w in range(len(scorer.group)) if w != avoid] or [avoid]
        worker = min(choices, key=lambda w: scorer.inflight[w])
        ref = scorer.group.actors[worker].score.remote(requests)
        scorer.inflight[worker] += 1
        self._calls[ref] = _Call(scorer, worker, samples, requests, attempt)

    def _retry_or_fail(self, call: _Call, exc: Exception) -> None:
        if call.attempt < call.scorer.retries:
            self._send(call.scorer, call.samples, call.requests, call.attempt + 1, avoid=call.worker)
            return
        error = f"reward worker of domain {call.scorer.name!r} failed: {type(exc).__name__}: {str(exc)[:300]}"
        for sample in call.samples:
            sample.reward = RewardResult.failed("error", error)

    # ---- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {name: s.adaptive.to_dict() for name, s in self.scorers.items() if s.adaptive is not None}

    def load_state_dict(self, state: dict) -> None:
        for name, saved in state.items():
            scorer = self.scorers.get(name)
            if scorer is not None and scorer.adaptive is not None:
                scorer.adaptive = type(scorer.adaptive).from_dict(saved)
