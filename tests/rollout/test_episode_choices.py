"""Turns of n samples through the real scheduler, episode runner and request book, under what a run throws
at them: samples back one at a time in any order, redundancy, the asynchronous window and restarts,
weight updates that abort what is in flight, engines lost (with and without their partial work handed
back), turn-synchronised barriers. Every sampled token is accounted for exactly once (trained, wasted, or
held by a running episode), every trained turn is one sample as it was sampled, and nothing stalls."""

from __future__ import annotations

import random

import pytest

from gyre.envs.calls import EnvCall, EnvResult, SlotPool
from gyre.envs.context import ContextBuilder
from gyre.envs.episode import EpisodeLimits
from gyre.envs.protocol import check_reset, check_step
from gyre.models.presets import build_char_tokenizer
from gyre.rollout.episodes import EpisodeRunner
from gyre.rollout.requests import Abort, Generate
from gyre.rollout.scheduler import RolloutScheduler, ScheduleSpec
from gyre.types import GenerationResult, PromptRecord, SamplingParams

TOK = build_char_tokenizer()


class PickingEnv:
    """Asks ``n`` samples of every turn and goes on with a random one; three turns per episode."""

    def __init__(self, rng: random.Random, n: int):
        self.rng, self.n, self.turn = rng, n, 0

    def _ask(self, text: str) -> dict:
        return {"messages": [{"role": "user", "content": text}], "sampling": {"n": self.n}}

    def reset(self, seed):
        self.turn = 0
        return self._ask(f"go {seed}"), {}

    def step(self, action):
        assert isinstance(action, list) and len(action) == self.n if self.n > 1 else isinstance(action, str)
        self.turn += 1
        info = {"choice": self.rng.randrange(self.n)} if self.n > 1 else {}
        return self._ask("more"), 1.0, self.turn >= 3, False, info


class World:
    """The engines and environments, scripted: each event is one sample back, one environment call answered,
    or (with ``lose_p``) an engine lost."""

    def __init__(self, sched: RolloutScheduler, seed: int, n: int, lose_p: float, handback: bool):
        self.sched, self.rng, self.n, self.lose_p, self.handback = sched, random.Random(seed), n, lose_p, handback
        self.running: list[tuple[int, object, int]] = []  # (engine, request, sample index)
        self.calls: list[EnvCall] = []
        self.envs: dict[int, PickingEnv] = {}
        self.sampled: dict[tuple[str, int], list[int]] = {}

    def pump(self) -> None:
        for command in self.sched.drain():
            if isinstance(command, Generate):
                self.running += [(command.engine, r, i) for r in command.requests
                                 for i in range(r.first_sample, r.first_sample + r.n)]
            elif isinstance(command, Abort):
                gone = {(e, rid) for e, ids in command.by_engine.items() for rid in ids}
                for item in [it for it in self.running if (it[0], it[1].request_id) in gone]:
                    self.running.remove(item)
                    self.deliver(item, "abort")
            elif isinstance(command, EnvCall):
                self.calls.append(command)

    def deliver(self, item, finish: str = "stop") -> None:
        _, r, i = item
        text = f"s{i}:" + "x" * self.rng.randint(1, 8)
        ids = list(TOK(text[:len(text) // 2] if finish == "abort" else text, add_special_tokens=False)["input_ids"])
        self.sampled[r.request_id, i] = ids
        self.sched.on_generated([GenerationResult(r.request_id, i, r.prompt_ids, ids, TOK.decode(ids),
                                                  [-0.1] * len(ids), finish, [self.sched.version] * len(ids))])

    def lose(self, engine: int) -> None:
        mine = [it for it in self.running if it[0] == engine]
        self.running = [it for it in self.running if it[0] != engine]
        ids = list(TOK("hb", add_special_tokens=False)["input_ids"])
        back = [GenerationResult(r.request_id, i, r.prompt_ids, ids, "hb", [-0.1] * len(ids), "abort",
                                 [self.sched.version] * len(ids)) for _, r, i in mine] if self.handback else []
        self.sched.on_engine_lost(engine, back)
        self.sched.on_engine_back(engine)

    def step(self) -> bool:
        self.pump()
        if not self.running and not self.calls:
            return False
        if self.lose_p and self.running and self.rng.random() < self.lose_p:
            self.lose(self.rng.choice([it[0] for it in self.running]))
        elif self.running and (not self.calls or self.rng.random() < 0.5):
            self.deliver(self.running.pop(self.rng.randrange(len(self.running))))
        else:
            call = self.calls.pop(self.rng.randrange(len(self.calls)))
            env = self.envs.setdefault(call.slot, PickingEnv(self.rng, self.n))
            value = check_reset(env.reset(call.arg)) if call.op == "reset" else check_step(env.step(call.arg))
            self.sched.on_env([EnvResult(call.call_id, value)])
        self.pump()
        return True

    def publish(self, version: int, abort: bool) -> None:
        if abort:  # a weight update without partial rollouts: every sample in flight comes back aborted
            items, self.running = self.running, []
            for item in items:
                self.deliver(item, "abort")
        self.sched.on_published(version)
        self.pump()


SCENARIOS = {
    "plain": {}, "redundant": {"extra": 2, "slots": 10}, "async": {"alpha": 1, "slots": 8},
    "async-restart": {"alpha": 1, "restart": True, "slots": 8},
    "aborting-updates": {"alpha": 1, "abort": True, "slots": 8},
    "lost-engines": {"lose_p": 0.02}, "lost-engines-handing-back": {"lose_p": 0.02, "handback": True},
    "turn-sync-lost-engines": {"turn_sync": True, "lose_p": 0.05},
}


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_sampled_token_is_trained_wasted_or_held_once_and_trained_turns_are_samples(scenario, n):
    for seed in range(4):
        sched, world, totals = _run(SCENARIOS[scenario], n, seed)
        generated, trained, wasted = (totals.get(f"rollout/tokens_{k}", 0) for k in ("generated", "trained", "wasted"))
        assert generated == trained + wasted + sched.tokens_held, (scenario, seed, totals)
        if n > 1:
            assert wasted > 0


def _run(kw: dict, n: int, seed: int, steps: int = 4):
    spec = ScheduleSpec(3, 2, SamplingParams(max_new_tokens=12), run_seed=5, async_ratio=kw.get("alpha", 0.0),
                        replicate=True, extra_samples=kw.get("extra", 0), restart_stale=kw.get("restart", False))
    runner = EpisodeRunner(SlotPool(kw.get("slots", 6)), ContextBuilder(TOK, use_template=False),
                           EpisodeLimits(max_turns=4, turn_tokens=12, context_tokens=400), spec.sampling,
                           turn_sync=kw.get("turn_sync", False))
    sched = RolloutScheduler(spec, engines=2, source=runner)
    world = World(sched, seed, n, kw.get("lose_p", 0.0), kw.get("handback", False))
    prompts = iter(PromptRecord(f"p{i}", "", [], "") for i in range(10_000))

    def draw(k: int) -> list[PromptRecord]:
        return [next(prompts) for _ in range(k)]

    totals: dict[str, float] = {}
    for step in range(1, steps + 1):
        sched.admit(step, draw)
        events = 0
        while not sched.ready(step):
            assert world.step(), f"seed {seed}: nothing left to happen before step {step} is ready"
            sched.admit(step, draw)
            events += 1
            assert events < 100_000
        for group in sched.take(step):
            for t in group.trajectories:  # each trained turn is one whole sample, as it was sampled
                assert all(s.token_ids in world.sampled.values() for s in t.segments if s.trainable)
        for k, v in sched.take_stats().items():
            totals[k] = totals.get(k, 0) + v
        if kw.get("alpha"):
            sched.admit(step + 1, draw)
            world.pump()
            for _ in range(world.rng.randrange(20)):
                world.step()
        world.publish(step, kw.get("abort", False))
    for k, v in sched.take_stats().items():
        totals[k] = totals.get(k, 0) + v
    return sched, world, totals
