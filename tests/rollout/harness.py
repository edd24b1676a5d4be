"""A scripted world for the scheduler tests: engines that finish samples in a random order, rewards that
arrive in a random order, weight versions that move. It runs the real scheduler through its commands
and events only, like the IO driver does (no Ray, no models)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from gyre.rollout.requests import Abort, Generate
from gyre.rollout.scheduler import RolloutScheduler, Score
from gyre.types import GenerationResult, PromptRecord, RewardResult


def prompts(k: int, start: int = 0) -> list[PromptRecord]:
    return [PromptRecord(f"p{i}", "q", [1] * (1 + i % 3), str(i)) for i in range(start, start + k)]


class Source:
    """Prompts in order, recording every one handed out."""

    def __init__(self):
        self.drawn: list[PromptRecord] = []

    def __call__(self, k: int) -> list[PromptRecord]:
        out = prompts(k, len(self.drawn))
        self.drawn += out
        return out


@dataclass
class World:
    sched: RolloutScheduler
    rng: random.Random
    reward: callable = lambda prompt, sample: float(sample % 2)
    version: int = 0
    running: list = field(default_factory=list)
    """(engine, request, sample index, tokens so far) of every sample being generated."""
    unscored: list = field(default_factory=list)
    aborted_results: int = 0

    def pump(self) -> None:
        for command in self.sched.drain():
            if isinstance(command, Generate):
                for r in command.requests:
                    self.running += [(command.engine, r, r.first_sample + i) for i in range(r.n)]
            elif isinstance(command, Abort):
                gone = {rid for ids in command.by_engine.values() for rid in ids}
                stopped = [x for x in self.running if x[1].request_id in gone]
                self.running = [x for x in self.running if x[1].request_id not in gone]
                self.aborted_results += len(stopped)
                self.sched.on_generated([self._result(x, "abort") for x in stopped])
            elif isinstance(command, Score):
                self.unscored += command.trajectories

    def _result(self, item, finish: str) -> GenerationResult:
        _, r, i = item
        n = 1 + (i + len(r.prompt_ids)) % 4
        return GenerationResult(r.request_id, i, r.prompt_ids, [5] * n, f"s{i}", [-0.5] * n, finish, [self.version] * n,
                                offset=len(r.prefix))

    def step(self) -> bool:
        """One random event; False when nothing is left to happen."""
        self.pump()
        if not self.running and not self.unscored:
            return False
        if self.running and (not self.unscored or self.rng.random() < 0.6):
            item = self.running.pop(self.rng.randrange(len(self.running)))
            self.sched.on_generated([self._result(item, "eos")])
        else:
            t = self.unscored.pop(self.rng.randrange(len(self.unscored)))
            t.reward = RewardResult(self.reward(t.prompt, t.sample_index))
            self.sched.on_scored([t])
        self.pump()
        return True

    def run_until_ready(self, step: int, draw) -> list:
        """Admit, play events until the batch of ``step`` is ready, take it."""
        self.sched.admit(step, draw)
        while not self.sched.ready(step):
            if not self.step():
                raise AssertionError(f"the world went quiet before step {step}'s batch was ready")
            self.sched.admit(step, draw)
        batch = self.sched.take(step)
        self.pump()
        return batch

    def publish(self, version: int, events: int = 0) -> None:
        """Some events under the old weights, then the new version everywhere."""
        for _ in range(events):
            self.step()
        self.version = version
        self.sched.on_published(version)
        self.pump()

    def lose(self, engine: int) -> int:
        """Engine ``engine`` dies with the samples it was generating; a fresh one takes its place."""
        gone = [x for x in self.running if x[0] == engine]
        self.running = [x for x in self.running if x[0] != engine]
        self.sched.on_engine_lost(engine)
        self.pump()
        self.sched.on_engine_back(engine)
        return len(gone)
