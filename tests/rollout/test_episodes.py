"""Multi-turn groups through the sans-IO scheduler: a scripted world that samples turns and steps real
environments (the built-in number game) in a random order, failing some environment calls."""

from __future__ import annotations

import math
import random

import pytest

from gyre.envs.builtin.guess import GuessNumber
from gyre.envs.calls import EnvCall, EnvResult, SlotPool
from gyre.envs.context import ContextBuilder
from gyre.envs.episode import EpisodeLimits
from gyre.envs.protocol import EnvError, EnvFailure, check_reset, check_step
from gyre.models.presets import build_char_tokenizer
from gyre.rollout.episodes import EpisodeRunner
from gyre.rollout.requests import Abort, Generate
from gyre.rollout.scheduler import RolloutScheduler, ScheduleSpec
from gyre.types import GenerationResult, PromptRecord, SamplingParams

TOKENIZER = build_char_tokenizer()


def seeds(k: int, start: int = 0) -> list[PromptRecord]:
    """Environment instances as the scheduler's prompts."""
    return [PromptRecord(f"env{i}", "", [], "") for i in range(start, start + k)]


class EnvWorld:
    """Engines answer turns with a random guess; environments answer in any order; ``fail`` decides
    which environment calls fail."""

    def __init__(self, sched: RolloutScheduler, rng: random.Random, fail=lambda call: False):
        self.sched, self.rng, self.fail = sched, rng, fail
        self.running: list = []
        self.calls: list[EnvCall] = []
        self.envs: dict[int, GuessNumber] = {}
        self.sampled: dict[str, list[int]] = {}
        """Request id -> the tokens the engine returned (the trained-equals-sampled check)."""
        self.in_use: set[int] = set()
        self.peak = 0
        self.engines_of: dict[str, set[int]] = {}
        """Episode key -> the engines its turns went to."""

    def pump(self) -> None:
        for command in self.sched.drain():
            if isinstance(command, Generate):
                self.running += list(command.requests)
                for r in command.requests:
                    self.engines_of.setdefault(r.request_id.rpartition("#")[0], set()).add(command.engine)
            elif isinstance(command, Abort):
                gone = {rid for ids in command.by_engine.values() for rid in ids}
                self.running = [r for r in self.running if r.request_id not in gone]
            elif isinstance(command, EnvCall):
                self.calls.append(command)
            else:
                raise AssertionError(f"unexpected command {command}")

    def step(self) -> bool:
        self.pump()
        if not self.running and not self.calls:
            return False
        if self.running and (not self.calls or self.rng.random() < 0.5):
            request = self.running.pop(self.rng.randrange(len(self.running)))
            text = f"\\boxed{{{self.rng.randint(1, 8)}}}"
            ids = list(TOKENIZER(text, add_special_tokens=False)["input_ids"])[:request.params.max_new_tokens]
            self.sampled[request.request_id] = ids
            self.sched.on_generated([GenerationResult(request.request_id, 0, request.prompt_ids, ids, text,
                                                      [-0.1] * len(ids), "stop", [self.sched.version] * len(ids))])
        else:
            call = self.calls.pop(self.rng.randrange(len(self.calls)))
            self.sched.on_env([EnvResult(call.call_id, self._answer(call))])
        self.pump()
        return True

    def _answer(self, call: EnvCall):
        if self.fail(call):
            return EnvFailure("timeout", "scripted")
        env = self.envs.setdefault(call.slot, GuessNumber(1, 8, max_turns=4))
        if call.op == "reset":
            return check_reset(env.reset(call.arg))
        return check_step(env.step(call.arg))

    def run_until_ready(self, step: int, draw):
        self.sched.admit(step, draw)
        while not self.sched.ready(step):
            assert self.step(), f"the world went quiet before step {step}'s batch was ready"
            self.sched.admit(step, draw)
        batch = self.sched.take(step)
        self.sched.on_published(step)  # the policy trained on it
        return batch


def scheduler(slots: int, extra: int = 0, alpha: float = 0.0, turn_sync: bool = False,
              restart: bool = False, observation_tokens: int = 256) -> RolloutScheduler:
    spec = ScheduleSpec(3, 2, SamplingParams(max_new_tokens=12), run_seed=5, async_ratio=alpha, replicate=True,
                        extra_samples=extra, restart_stale=restart)
    limits = EpisodeLimits(max_turns=4, turn_tokens=12, context_tokens=400, observation_tokens=observation_tokens)
    runner = EpisodeRunner(SlotPool(slots), ContextBuilder(TOKENIZER, use_template=False), limits, spec.sampling,
                           turn_sync=turn_sync)
    return RolloutScheduler(spec, engines=2, source=runner)


def check_batch(world: EnvWorld, batch) -> None:
    for group in batch:
        assert len(group.trajectories) == 3 and group.status == "committed"
        firsts = {tuple(t.prompt.prompt_ids) for t in group.trajectories}
        assert len(firsts) == 1  # every episode of a group plays the same environment seed
        for t in group.trajectories:
            assert t.status == "scored" and 1 <= len(t.turns) <= 4
            assert t.reward.score == pytest.approx(sum(turn.reward for turn in t.turns))
            model = [s for s in t.segments if s.trainable]
            ids = t.response_ids
            # Trained equals sampled: each turn's tokens are exactly what the engine returned for it.
            for turn, segment in zip(t.turns, model):
                assert ids[turn.start:turn.end] == segment.token_ids
            key = f"{group.group_id}/"
            turns = [rid for rid in world.sampled if rid.startswith(key) and rid.split("#")[0].endswith(
                f"/{t.sample_index}")]
            assert [world.sampled[rid] for rid in sorted(turns, key=lambda r: int(r.split("#")[1]))] == \
                [s.token_ids for s in model]
            assert all(not s.trainable for s in t.segments[1::2])  # observations between turns


@pytest.mark.parametrize("seed", range(4))
def test_episodes_run_each_at_their_own_pace_and_commit_as_groups(seed):
    world = EnvWorld(scheduler(slots=4), random.Random(seed))
    source = iter(seeds(100))
    for step in (1, 2, 3):
        batch = world.run_until_ready(step, lambda k: [next(source) for _ in range(k)])
        check_batch(world, batch)
    assert len(world.sched.source.slots.free) + len(world.sched.source.live) >= 4
    # every turn of an episode went to the engine of its first (two engines, no slots: always room)
    assert all(len(engines) == 1 for engines in world.engines_of.values())


def test_failed_environments_cost_one_episode_each():
    failing = {"n": 0}

    def fail(call: EnvCall) -> bool:  # every seventh call fails
        failing["n"] += 1
        return failing["n"] % 7 == 0

    world = EnvWorld(scheduler(slots=3), random.Random(1), fail)
    source = iter(seeds(100))
    batch = world.run_until_ready(1, lambda k: [next(source) for _ in range(k)])
    check_batch(world, batch)
    stats = world.sched.take_stats()
    assert stats["env/failures_timeout"] >= 1
    indices = [t.sample_index for g in batch for t in g.trajectories]
    assert max(indices) >= 3 or stats.get("rollout/groups_failed", 0) >= 1  # replacements ran


def test_an_environment_that_fails_every_episode_stops_the_run_with_its_failure(caplog):
    """Without a limit its groups would be given up and replaced forever, the run silent."""
    world = EnvWorld(scheduler(slots=3), random.Random(1), fail=lambda call: True)
    source = iter(seeds(100))
    with pytest.raises(EnvError, match=r"failed every episode of the last 8 groups .*\(timeout\): scripted"):
        world.run_until_ready(1, lambda k: [next(source) for _ in range(k)])
    assert world.sched.stats["env/groups_failed"] == 8 and world.sched.stats["env/failures_timeout"] == 8 * 4
    assert [r.getMessage() for r in caplog.records] == [
        "an environment failed (timeout): scripted. Its episode is replaced; failures are counted in "
        "env/failures_timeout, and only the first of each kind is shown"]


def test_observations_cut_to_their_limit_are_counted():
    world = EnvWorld(scheduler(slots=6, observation_tokens=3), random.Random(3))
    source = iter(seeds(100))
    batch = world.run_until_ready(1, lambda k: [next(source) for _ in range(k)])
    kept = [t.segments[1::2] for g in batch for t in g.trajectories]
    assert all(len(obs.token_ids) == 3 for segments in kept for obs in segments)  # "5: too low." and the like
    cut = sum(len(segments) for segments in kept)
    assert cut >= 1 and world.sched.take_stats()["env/observations_cut"] == cut


def test_redundant_episodes_are_stopped_once_a_group_has_its_size():
    world = EnvWorld(scheduler(slots=10, extra=2), random.Random(2))
    source = iter(seeds(100))
    batch = world.run_until_ready(1, lambda k: [next(source) for _ in range(k)])
    check_batch(world, batch)
    world.pump()
    runner = world.sched.source
    assert not any(live.group in {g.group_id for g in batch} for live in runner.live.values())
    assert len(runner.slots.free) == 10 - sum(live.slot is not None for live in runner.live.values())


@pytest.mark.parametrize("restart", [False, True])
@pytest.mark.parametrize("alpha", [0.5, 1, 2])
def test_asynchronous_episodes_stay_inside_the_window(alpha, restart):
    """Every episode trained started within the window; an episode that left it cost its group (abort) or
    was restarted from reset (restart: no group is lost)."""
    world = EnvWorld(scheduler(slots=6, alpha=alpha, restart=restart), random.Random(alpha))
    source = iter(seeds(200))
    totals: dict[str, float] = {}
    for step in range(1, 9):
        batch = world.run_until_ready(step, lambda k: [next(source) for _ in range(k)])
        check_batch(world, batch)
        stats = world.sched.take_stats()
        assert stats["staleness/violations"] == 0
        assert all(step - 1 - t.weight_version <= math.ceil(alpha) for g in batch for t in g.trajectories)
        for key in ("rollout/groups_expired", "env/episodes_restarted"):
            totals[key] = totals.get(key, 0) + stats.get(key, 0)
        for _ in range(world.rng.randrange(40)):  # the rollout goes on while the policy trains
            world.step()
            world.sched.admit(step + 1, lambda k: [next(source) for _ in range(k)])
    assert totals["rollout/groups_expired" if restart else "env/episodes_restarted"] == 0


def test_episodes_that_left_the_window_restart_from_reset_and_their_groups_live_on():
    world = EnvWorld(scheduler(slots=6, alpha=1, restart=True), random.Random(7))
    source = iter(seeds(100))
    world.sched.admit(1, lambda k: [next(source) for _ in range(k)])  # 4 groups of 3 episodes, 6 slots
    runner = world.sched.source
    while not any(f.group.trajectories for f in world.sched.flights.values()):
        assert world.step()
    finished = sum(len(f.group.trajectories) for f in world.sched.flights.values())
    started = sum(live.started == 0 for live in runner.live.values())
    groups = set(world.sched.flights)
    world.sched.on_published(1)
    world.sched.on_published(2)  # alpha 1: what version 0 sampled can no longer train
    stats = world.sched.take_stats()
    assert stats["env/episodes_restarted"] == finished + started and not stats.get("rollout/groups_expired")
    assert set(world.sched.flights) == groups and not any(f.group.trajectories for f in world.sched.flights.values())
    assert all(f.group.admitted_version >= 1 for f in world.sched.flights.values())
    assert all(live.started is None for live in runner.live.values())
    while not world.sched.buffer.entries:
        assert world.step()
    (_, group), = world.sched.buffer.entries
    assert group.group_id in groups and {t.weight_version for t in group.trajectories} == {2}  # sampled since
    firsts = {tuple(t.prompt.prompt_ids) for t in group.trajectories}
    assert len(firsts) == 1  # restarted on the same environment seed


def test_turn_synchronised_batching_never_samples_while_an_environment_steps():
    world = EnvWorld(scheduler(slots=6, turn_sync=True), random.Random(3))
    source = iter(seeds(100))
    overlaps = []
    step = world.step

    def watched_step():
        world.pump()
        overlaps.append(bool(world.running) and any(c.op == "step" for c in world.calls))
        return step()

    world.step = watched_step
    for n in (1, 2):
        check_batch(world, world.run_until_ready(n, lambda k: [next(source) for _ in range(k)]))
    assert len(overlaps) > 20 and not any(overlaps)


def test_a_lost_engine_does_not_stall_turn_synchronised_episodes():
    """Turns owed by a lost engine are asked again; under the barrier too, the batch completes."""
    world = EnvWorld(scheduler(slots=6, turn_sync=True), random.Random(5))
    source = iter(seeds(100))
    world.sched.admit(1, lambda k: [next(source) for _ in range(k)])
    lost = False
    while not world.sched.ready(1):
        world.pump()
        if not lost and world.running:
            owed = {rid for rid, (engine, _) in world.sched.requests.live.items() if engine == 0}
            if owed:
                world.running = [r for r in world.running if r.request_id not in owed]
                world.sched.on_engine_lost(0)
                world.sched.on_engine_back(0)
                lost = True
        assert world.step(), "the world went quiet: a held turn was never released"
    assert lost and world.sched.take_stats()["rollout/samples_requeued"] >= 1
    check_batch(world, world.sched.take(1))
