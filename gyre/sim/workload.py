"""The simulated task: prompts, long-tailed response lengths, pass rates, reward and environment latency.

A sample's length is ``min(max_tokens, base x d_prompt x e_sample)``: ``d_prompt`` (the prompt's
difficulty) and ``e_sample`` (its own noise) are lognormal with mean 1, so lengths are long-tailed and
samples of a hard prompt are long together (RollPacker's observation: the tail is mostly prompts). Every
draw is a function of the run seed and the sample's identity (prompt, sample index), never of the order
events happen in: the same seed gives the same lengths under every schedule, and a sample regenerated
on another engine comes out as long as the lost one would have.

``fit_lengths(metrics.jsonl)`` recovers the length distribution from a real run's logged mean, max and
truncated fraction of response lengths. A lognormal cannot carry every task (a bimodal one, short answers
and a few that run to the cap, fits with a huge sigma), so ``RecordedWorkload`` replays a real run's
recorded groups instead (``recorded_groups(run_dir)``: its generation files, when they hold whole groups).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import NormalDist

from gyre.envs.latency import lognormal_params
from gyre.sim.tokens import Filler
from gyre.types import PromptRecord

_NORMAL = NormalDist()


def _mix(*parts: int) -> int:
    """A 64-bit hash of integers (splitmix64 steps): cheap, order-sensitive, stable across runs."""
    x = 0x9E3779B97F4A7C15
    for p in parts:
        x = (x ^ (p & 0xFFFFFFFFFFFFFFFF)) + 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        x = (x ^ (x >> 27)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 31
    return x


def uniform(*parts: int) -> float:
    """A uniform draw in (0, 1) keyed by ``parts``."""
    return (_mix(*parts) + 0.5) / 2.0 ** 64


def normal(*parts: int) -> float:
    return _NORMAL.inv_cdf(uniform(*parts))


def lognormal(mean: float, cv: float, *parts: int) -> float:
    """A lognormal draw with this mean and coefficient of variation (cv 0: the mean itself)."""
    if cv <= 0 or mean <= 0:
        return max(mean, 0.0)
    mu, sigma = lognormal_params(mean, cv)
    return math.exp(mu + sigma * normal(*parts))


@dataclass(frozen=True)
class WorkloadSpec:
    """The task's shape (every field documented in ``gyre.config.sim_schema``, which builds this)."""

    prompt_tokens: float = 256.0
    prompt_tokens_cv: float = 0.3
    response_tokens: float = 1024.0
    """Mean response length before the cap (max_tokens)."""
    length_sigma: float = 0.9
    """Lognormal sigma of a response's length (prompt difficulty and sample noise together)."""
    prompt_share: float = 0.6
    """Share of the length's log-variance that belongs to the prompt (samples of a prompt vary together)."""
    max_tokens: int = 4096
    pass_rate: float = 0.5
    """Mean chance a sample is correct; each prompt has its own (harder, longer prompts pass less)."""
    reward_latency_s: float = 0.5
    reward_latency_cv: float = 1.0
    turns: float = 1.0
    """Agentic: mean turns per episode (1: single-turn RLVR)."""
    turns_cv: float = 0.5
    turn_tokens: float = 256.0
    """Agentic: mean tokens the model writes per turn (capped by max_tokens)."""
    observation_tokens: float = 128.0
    """Agentic: mean tokens of an environment's observation."""
    env_latency_s: float = 1.0
    """Agentic: mean seconds of an environment step."""
    env_latency_cv: float = 1.0
    reset_latency_s: float = 1.0
    env_failure_rate: float = 0.0
    """Agentic: chance an environment call fails (raises, crashes) after its latency."""
    env_hang_rate: float = 0.0
    """Agentic: chance an environment call never answers (it fails at its deadline)."""


@dataclass
class Workload:
    spec: WorkloadSpec
    seed: int = 0

    def prompt(self, index: int) -> PromptRecord:
        """The ``index``-th training prompt: its length, difficulty and pass rate."""
        s = self.spec
        length = max(1, round(lognormal(s.prompt_tokens, s.prompt_tokens_cv, self.seed, 1, index)))
        z = normal(self.seed, 2, index)
        difficulty = math.exp(math.sqrt(s.prompt_share) * s.length_sigma * z)
        # Harder prompts pass less: the pass rate falls with the difficulty's z-score around the mean rate.
        logit = math.log(s.pass_rate / (1 - s.pass_rate)) if 0 < s.pass_rate < 1 else 0.0
        p = s.pass_rate if s.pass_rate in (0.0, 1.0) else 1 / (1 + math.exp(-(logit - 1.5 * z)))
        return PromptRecord(f"sim:{index}", "", Filler(length), "", domain="sim",
                            columns={"index": index, "z": z, "difficulty": difficulty, "pass": p})

    def response_tokens(self, prompt: PromptRecord, sample: int) -> int:
        """How long this sample is, uncapped (the engine stops it at its token budget)."""
        s = self.spec
        var = s.length_sigma ** 2
        own = math.sqrt(max(0.0, 1 - s.prompt_share) * var)
        mu = math.log(max(s.response_tokens, 1.0)) - var / 2
        z = normal(self.seed, 3, prompt.columns["index"], sample)
        return max(1, round(math.exp(mu + math.sqrt(s.prompt_share * var) * prompt.columns["z"] + own * z)))

    def correct(self, prompt: PromptRecord, sample: int) -> bool:
        return uniform(self.seed, 4, prompt.columns["index"], sample) < prompt.columns["pass"]

    def reward_latency(self, prompt: PromptRecord, sample: int) -> float:
        s = self.spec
        return lognormal(s.reward_latency_s, s.reward_latency_cv, self.seed, 5, prompt.columns["index"], sample)

    # ---- agentic ----------------------------------------------------------------------------------
    def turns(self, env_seed: int) -> int:
        s = self.spec
        return max(1, round(lognormal(s.turns, s.turns_cv, self.seed, 6, env_seed)))

    def env_success(self, env_seed: int, episode: int) -> bool:
        """Whether episode ``episode`` (its index in the group) on this environment seed ends in success, at
        the mean pass rate. Keyed by the episode too: a group's episodes share the seed, and if they all
        passed or failed together no group would have reward variance (dynamic sampling would drop all)."""
        return uniform(self.seed, 11, env_seed, episode) < self.spec.pass_rate

    def observation_tokens(self, env_seed: int, turn: int) -> int:
        return max(1, round(lognormal(self.spec.observation_tokens, 0.5, self.seed, 7, env_seed, turn)))

    def turn_tokens(self, prompt_index: int, episode: int, turn: int) -> int:
        """Tokens the model writes in turn ``turn`` of episode ``episode`` (its index in the group) of a prompt."""
        s = self.spec
        return max(1, round(lognormal(s.turn_tokens, s.length_sigma, self.seed, 8, prompt_index, episode, turn)))

    def env_fault(self, call: tuple[int, ...]) -> str | None:
        """How environment call ``call`` goes wrong: "hang", "error", or None (it answers)."""
        s, u = self.spec, uniform(self.seed, 12, *call)
        if u < s.env_hang_rate:
            return "hang"
        return "error" if u < s.env_hang_rate + s.env_failure_rate else None

    def env_latency(self, call: tuple[int, ...], op: str) -> float:
        """Seconds of an environment call; ``call`` names it (env seed, episode index, call number)."""
        s = self.spec
        if op == "reset":
            return lognormal(s.reset_latency_s, 0.5, self.seed, 9, *call)
        return lognormal(s.env_latency_s, s.env_latency_cv, self.seed, 10, *call)


# ---- fitting from a real run ----------------------------------------------------------------------
def _capped_stats(mu: float, sigma: float, cap: float, n: int) -> tuple[float, float, float]:
    """(mean, expected max of n, truncated fraction) of min(cap, lognormal(mu, sigma))."""
    a = (math.log(cap) - mu) / sigma
    trunc = 1 - _NORMAL.cdf(a)
    mean = math.exp(mu + sigma ** 2 / 2) * _NORMAL.cdf(a - sigma) + cap * trunc
    q = _NORMAL.inv_cdf(1 - 1 / (n + 1))
    return mean, min(cap, math.exp(mu + sigma * q)), trunc


def fit_lengths(metrics: str | Path, max_tokens: int, spec: WorkloadSpec | None = None) -> WorkloadSpec:
    """The length distribution (mean before the cap, sigma) whose capped mean, per-step max and truncated
    fraction best match a real run's ``metrics.jsonl`` (its training steps' ``response_length/*``)."""
    rows = []
    for line in Path(metrics).read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "response_length/mean" in r and "time/step" in r:
            rows.append(r)
    if not rows:
        raise ValueError(f"{metrics} has no training steps with response_length/mean: give the metrics.jsonl of "
                         f"a gyre RL run")
    mean = sum(r["response_length/mean"] for r in rows) / len(rows)
    top = sum(r["response_length/max"] for r in rows) / len(rows)
    trunc = sum(r.get("response_length/truncated_frac", 0.0) for r in rows) / len(rows)
    n = round(sum(r.get("batch/samples", 64) for r in rows) / len(rows))
    best = None
    for i in range(1, 121):  # sigma on a grid, the uncapped mean by bisection on the capped mean
        sigma = 0.025 * i
        lo, hi = math.log(0.5), math.log(max_tokens * 50.0)
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _capped_stats(mid, sigma, max_tokens, n)[0] < mean else (lo, mid)
        mu = (lo + hi) / 2
        _, m_max, m_trunc = _capped_stats(mu, sigma, max_tokens, n)
        err = ((m_max - top) / max(top, 1.0)) ** 2 + (m_trunc - trunc) ** 2
        if best is None or err < best[0]:
            best = (err, mu, sigma)
    _, mu, sigma = best
    return replace(spec or WorkloadSpec(), response_tokens=math.exp(mu + sigma ** 2 / 2), length_sigma=sigma,
                   max_tokens=max_tokens)


# ---- replaying a real run -------------------------------------------------------------------------
RecordedGroup = tuple[int | None, tuple[int, ...]]
"""(prompt tokens, or None when not recorded; the response tokens of each sample)."""


class RecordedWorkload(Workload):
    """Lengths replayed from a real run: the ``index``-th prompt drawn is one of the recorded groups of
    step ``index // per_step`` (the last step's beyond), picked by the seed and the index, and its samples
    have that group's lengths (its prompt that group's prompt length, when recorded). Lengths follow the
    run's own course: an RL policy's lengths drift as it learns. Rewards and latencies keep the spec's."""

    def __init__(self, spec: WorkloadSpec, seed: int, steps: Sequence[Sequence[RecordedGroup]], per_step: int):
        super().__init__(spec, seed)
        self.steps = [list(groups) for groups in steps if groups]
        if not self.steps:
            raise ValueError("no recorded groups to replay")
        self.per_step = max(1, per_step)

    def _group(self, index: int) -> RecordedGroup:
        pool = self.steps[min(index // self.per_step, len(self.steps) - 1)]
        return pool[_mix(self.seed, 12, index) % len(pool)]

    def prompt(self, index: int) -> PromptRecord:
        record = super().prompt(index)
        tokens = self._group(index)[0]
        return replace(record, prompt_ids=Filler(max(1, tokens))) if tokens is not None else record

    def response_tokens(self, prompt: PromptRecord, sample: int) -> int:
        lengths = self._group(prompt.columns["index"])[1]
        return max(1, lengths[sample % len(lengths)])


def recorded_groups(run_dir: str | Path) -> list[list[RecordedGroup]] | None:
    """A run's training samples' lengths by step and group, from ``generations/step_N.jsonl``; None when
    the files do not hold whole groups (a run records only ``logging.generations_samples`` samples a step:
    set it to the batch size, and ``logging.generations_every=1``, to calibrate from its groups)."""
    files = sorted(((int(m.group(1)), f) for f in Path(run_dir, "generations").glob("step_*.jsonl")
                    if (m := re.fullmatch(r"step_(\d+)\.jsonl", f.name))), key=lambda e: e[0])
    steps = []
    for _, f in files:
        groups: dict[str, dict[int, int]] = {}
        for line in f.read_text().splitlines():
            try:
                r = json.loads(line)
                groups.setdefault(r["group"], {})[int(r["sample"])] = int(r["response_tokens"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                continue
        steps.append([(None, tuple(v for _, v in sorted(g.items()))) for g in groups.values()])
    sizes = {len(lengths) for groups in steps for _, lengths in groups}
    if not steps or len(sizes) != 1 or sizes == {1}:
        return None
    return steps
