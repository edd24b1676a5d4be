"""The sans-IO scheduler through scripted and random event orders (``harness.World``): admission,
commit exactly once, the async window, redundancy, dynamic sampling, tail batching, speculation."""

import random

import pytest

from gyre.rollout.buffer import staleness_limit
from gyre.rollout.ledger import audit, step_line, summary
from gyre.rollout.policies import GroupFilter, TailSpec
from gyre.rollout.requests import Generate
from gyre.rollout.scheduler import RolloutScheduler, ScheduleSpec
from gyre.seeding import derive_seed
from gyre.types import GenerationResult, RewardResult, SamplingParams
from tests.rollout.harness import Source, World


def spec(n=3, groups=4, **kw):
    return ScheduleSpec(n, groups, SamplingParams(max_new_tokens=4), run_seed=7, **kw)


def test_admission_builds_seeded_requests_spread_over_engines():
    sched = RolloutScheduler(spec(), engines=2)
    assert sched.admission.capacity(1) == 4
    sched.admit(1, Source())
    commands = sched.drain()
    assert {c.engine for c in commands} == {0, 1} and all(isinstance(c, Generate) for c in commands)
    requests = sorted((r for c in commands for r in c.requests), key=lambda r: r.request_id)
    assert [r.request_id for r in requests] == ["train-1-0", "train-1-1", "train-1-2", "train-1-3"]
    assert requests[2].seed == derive_seed(7, "train", 1, 2) and all(r.n == 3 for r in requests)
    assert sched.admission.capacity(1) == 0  # alpha 0: one batch per step


def test_replication_sends_each_sample_alone_to_the_least_loaded_engine():
    sched = RolloutScheduler(spec(n=4, groups=1, replicate=True), engines=3)
    sched.admit(1, Source())
    requests = [(c.engine, r) for c in sched.drain() for r in c.requests]
    assert sorted(r.request_id for _, r in requests) == [f"train-1-0/{i}" for i in range(4)]
    assert all(r.n == 1 and r.first_sample == int(r.request_id[-1]) for _, r in requests)
    assert sorted(e for e, _ in requests) == [0, 0, 1, 2]  # spread, not pinned to one engine


@pytest.mark.parametrize("replicate", [False, True])
def test_every_group_commits_once_whatever_the_order_of_events(replicate):
    for seed in range(20):
        world = World(RolloutScheduler(spec(n=3, groups=5, replicate=replicate), engines=3), random.Random(seed))
        batch = world.run_until_ready(1, Source())
        assert [g.group_id for g in batch] == [f"train-1-{i}" for i in range(5)]  # admission order
        assert all([t.sample_index for t in g.trajectories] == [0, 1, 2] for g in batch)
        assert world.sched.idle and len(world.sched.buffer) == 0 and world.sched.outstanding == 0


def test_a_group_commits_only_when_every_sample_is_scored():
    sched = RolloutScheduler(spec(n=2, groups=1), engines=1)
    sched.admit(1, Source())
    (cmd,) = sched.drain()
    (r,) = cmd.requests
    sched.on_generated([GenerationResult(r.request_id, i, [1], [5], "x", [-1.0], "eos", [0]) for i in range(2)])
    (score,) = sched.drain()
    first, second = score.trajectories
    first.reward = RewardResult(0.0)
    sched.on_scored([first])
    assert not sched.ready(1)
    second.reward = RewardResult(1.0)
    sched.on_scored([second])
    assert sched.ready(1) and sched.take(1)[0].status == "committed"
    with pytest.raises(ValueError, match="without a reward"):
        sched.on_scored([first.__class__(first.prompt, 0)])


@pytest.mark.parametrize("alpha", [0.5, 1, 1.5, 2, 3])
def test_the_staleness_window_is_never_exceeded(alpha):
    """A random asynchronous run: engines finish samples in any order while versions move. No batch holds
    a group older than the window, and every admitted group ends trained or aborted, exactly once."""
    for seed in range(6):
        rng = random.Random(seed)
        world = World(RolloutScheduler(spec(n=2, groups=4, async_ratio=alpha, replicate=True), engines=2), rng)
        source, trained = Source(), []
        for step in range(1, 13):
            batch = world.run_until_ready(step, source)
            assert all(step - 1 - g.admitted_version <= staleness_limit(alpha) for g in batch)
            stats = world.sched.take_stats()
            assert stats["staleness/violations"] == 0
            oldest = sum(step - 1 - g.admitted_version == staleness_limit(alpha) for g in batch)
            if alpha != int(alpha):
                assert oldest <= int((alpha % 1) * 4)
            trained += [g.prompt.uid for g in batch]
            world.publish(step, events=rng.randrange(12))
        assert len(trained) == len(set(trained))  # no group trained twice
        in_flight = {f.group.prompt.uid for f in world.sched.flights.values()}
        buffered = {g.prompt.uid for _, g in world.sched.buffer.entries}
        assert not (set(trained) & (in_flight | buffered)) and not (in_flight & buffered)


def test_async_admits_ahead_of_need():
    sched = RolloutScheduler(spec(n=2, groups=4, async_ratio=1.5, replicate=True), engines=2)
    sched.admit(1, Source())
    assert len(sched.flights) == 4 + 6  # P + round(alpha * P) before the first batch


def test_redundant_groups_are_aborted_once_the_batch_is_full():
    world = World(RolloutScheduler(spec(n=2, groups=3, redundancy=2), engines=2), random.Random(3))
    batch = world.run_until_ready(1, Source())
    stats = world.sched.take_stats()
    assert len(batch) == 3 and stats["rollout/groups_admitted"] == 5
    assert stats["rollout/groups_redundant"] == 2 and world.sched.idle
    order = [int(g.group_id.split("-")[-1]) for g in batch]
    assert order == sorted(order)  # the first three to complete, in admission order


def test_dynamic_sampling_drops_uniform_groups_and_refills():
    # Prompts p0, p2, p4... score the same on every sample (filtered); odd prompts vary.
    def reward(prompt, sample):
        return 1.0 if int(prompt.uid[1:]) % 2 == 0 else float(sample % 2)

    world = World(RolloutScheduler(spec(n=2, groups=3, group_filter=GroupFilter(0.0), max_draws=9), engines=2),
                  random.Random(0), reward)
    batch = world.run_until_ready(1, Source())
    stats = world.sched.take_stats()
    assert all(int(g.prompt.uid[1:]) % 2 == 1 for g in batch)
    assert stats["rollout/groups_filtered"] >= 3 and stats["rollout/groups_admitted"] <= 9


def test_dynamic_sampling_falls_back_when_draws_run_out():
    world = World(RolloutScheduler(spec(n=2, groups=3, group_filter=GroupFilter(0.0), max_draws=4), engines=1),
                  random.Random(0), lambda prompt, sample: 1.0)  # every group is uniform
    batch = world.run_until_ready(1, Source())
    stats = world.sched.take_stats()
    assert len(batch) == 3 and stats["rollout/groups_admitted"] == 4 and stats["rollout/filter_fallback"] == 3


def test_tail_batching_trains_every_prompt_exactly_once():
    world = World(RolloutScheduler(spec(n=4, groups=4, tail=TailSpec(1.5, 1.5)), engines=2), random.Random(1))
    source, trained, rounds = Source(), [], []
    for step in range(1, 16):
        batch = world.run_until_ready(step, source)
        stats = world.sched.take_stats()
        rounds.append(stats["rollout/long_round"])
        assert len(batch) == 4 and all(len(g.trajectories) == 4 for g in batch)
        trained += [g.prompt.uid for g in batch]
        world.publish(step)
    waiting = [p.uid for p in world.sched.admission.tail.long_queue]
    assert len(trained) == len(set(trained))  # never twice
    assert sorted(trained + waiting) == sorted(p.uid for p in source.drawn)  # never lost
    assert 1.0 in rounds and 0.0 in rounds and len(waiting) < 4
    # A short round launches ceil(1.5 * 4) = 6 prompts with 6 samples each; a long one 4 x 4.
    assert world.sched.admission.tail.rounds["long"] == sum(rounds)


def test_speculative_samples_beyond_the_group_are_aborted():
    world = World(RolloutScheduler(spec(n=2, groups=1, tail=TailSpec(1.0, 2.0)), engines=1), random.Random(2))
    world.run_until_ready(1, Source())
    assert world.aborted_results + world.sched.take_stats().get("rollout/samples_aborted", 0) >= 2


def test_an_engine_dropped_sample_is_regenerated_with_its_stream():
    sched = RolloutScheduler(spec(n=1, groups=1), engines=1)
    sched.admit(1, Source())
    (cmd,) = sched.drain()
    (r,) = cmd.requests
    sched.on_generated([GenerationResult(r.request_id, 0, [1], [5, 5], "x", [-1.0, -1.0], "abort", [0, 0])])
    (retry,) = sched.drain()
    (again,) = retry.requests
    assert again.seed == r.seed and again.first_sample == 0 and again.n == 1 and again.request_id != r.request_id
    assert sched.take_stats()["rollout/tokens_wasted"] == 2


def test_tail_batching_refuses_asynchrony():
    with pytest.raises(ValueError, match="async_ratio 0"):
        spec(tail=TailSpec(), async_ratio=1.0)


@pytest.mark.parametrize("replicate", [False, True])
def test_samples_of_a_lost_engine_are_asked_of_the_others(replicate):
    for seed in range(10):
        rng = random.Random(seed)
        world = World(RolloutScheduler(spec(n=3, groups=4, replicate=replicate), engines=3), rng)
        world.sched.admit(1, Source())
        world.pump()
        for _ in range(rng.randrange(8)):
            world.step()
        owed = world.lose(0)
        assert all(engine != 0 for engine, _, _ in world.running)  # nothing new went to the lost engine
        while not world.sched.ready(1):
            assert world.step()
        batch = world.sched.take(1)
        assert [g.group_id for g in batch] == [f"train-1-{i}" for i in range(4)]
        assert all([t.sample_index for t in g.trajectories] == [0, 1, 2] for g in batch)
        assert world.sched.take_stats().get("rollout/samples_requeued", 0) == owed


def test_a_checkpoint_keeps_every_prompt_drawn_and_not_trained():
    world = World(RolloutScheduler(spec(n=2, groups=4, tail=TailSpec(1.5, 1.0)), engines=2), random.Random(4))
    source, trained = Source(), []
    for step in (1, 2):
        trained += [g.prompt.uid for g in world.run_until_ready(step, source)]
        world.publish(step)
    state = world.sched.state_dict()
    assert state["admitted"] == [] and len(state["long_queue"]) == 4  # two short rounds cut 2 prompts each
    fresh = RolloutScheduler(spec(n=2, groups=4, tail=TailSpec(1.5, 1.0)), engines=2)
    fresh.load_state_dict(state, {p.uid: p for p in source.drawn})
    assert fresh.requeued == []
    assert fresh.admission.tail.plan(4, 2)[0] == "long" and sorted(state["long_queue"] + trained) == \
        sorted(p.uid for p in source.drawn)
    # Asynchronous: groups admitted ahead (in flight or committed) come back to be admitted again.
    world = World(RolloutScheduler(spec(n=2, groups=2, async_ratio=2, replicate=True), engines=2), random.Random(5))
    world.run_until_ready(1, source)
    state = world.sched.state_dict()
    assert len(state["admitted"]) == 4
    with pytest.raises(ValueError, match="lacks"):
        fresh.load_state_dict(state, {})


@pytest.mark.parametrize("alpha", [0.25, 0.5, 0.75, 1.2])
def test_fractional_alpha_admitting_during_training_never_stalls(alpha):
    """As the asynchronous pipeline does: groups are admitted for the next step while the policy trains,
    under the old weights. Those beyond what the next batch may take at the window's edge are aborted at
    the publication, so the window never fills with groups no batch can use."""
    for seed in range(4):
        rng = random.Random(seed)
        world = World(RolloutScheduler(spec(n=2, groups=4, async_ratio=alpha, replicate=True), engines=2), rng)
        source = Source()
        for step in range(1, 9):
            batch = world.run_until_ready(step, source)
            assert world.sched.take_stats()["staleness/violations"] == 0 and len(batch) == 4
            world.sched.admit(step + 1, source)  # while training step `step`
            world.pump()
            for _ in range(rng.randrange(10)):
                world.step()
            world.publish(step)


def test_oldest_quota_is_exact_for_decimal_alphas():
    from gyre.rollout.buffer import oldest_quota

    assert [oldest_quota(1.2, 5), oldest_quota(1.2, 10), oldest_quota(2.4, 5), oldest_quota(3.9, 10)] == [1, 2, 2, 9]


def async_run(sched: RolloutScheduler, seed: int, steps: int = 12, fifo: bool = False):
    """The pipeline's order of calls: step n's batch, then (asynchronous: while the policy trains on it)
    admissions under the old weights and some events, then the new weights. ``fifo``: engines and rewards
    finish in admission order (no tail: nothing can overtake an older group). Returns the world, the
    prompt source, the trained prompts' uids, and every step's counters summed."""
    rng = random.Random(seed)
    world = World(sched, rng)
    if sched.spec.group_filter is not None:  # even prompts score alike on every sample: the filter drops them
        world.reward = lambda prompt, sample: 1.0 if int(prompt.uid[1:]) % 2 == 0 else float(sample % 2)
    if fifo:
        world.rng = type("First", (), {"randrange": staticmethod(lambda n: 0), "random": staticmethod(lambda: 0.0)})()
    source, trained, totals = Source(), [], {}
    world.ledger = []
    for step in range(1, steps + 1):
        trained += [g.prompt.uid for g in world.run_until_ready(step, source)]
        world.ledger.append(step_line(step, world.sched.take_ledger()))
        for key, value in world.sched.take_stats().items():
            totals[key] = totals.get(key, 0) + value
        if sched.spec.async_ratio > 0:  # while the policy trains on step `step` (synchronous runs wait)
            world.sched.admit(step + 1, source)
            world.pump()
        world.publish(step, events=rng.randrange(12))
    for key, value in world.sched.take_stats().items():  # the last publication's expiries
        totals[key] = totals.get(key, 0) + value
    world.ledger.append({**step_line(steps, world.sched.take_ledger()), "pending": world.sched.pending_prompts()})
    return world, source, trained, totals


@pytest.mark.parametrize("alpha", [0.5, 1, 2])
def test_the_window_admits_no_group_that_cannot_train_within_the_bound(alpha):
    """ROLL Flash's window with AReaL's throttle: while step n trains, only what step n + 1 can take is
    admitted; after its publication, what fits the window. Where nothing overtakes (samples finish in
    admission order), nothing expires: every group generated trains (at alpha 1, admitting P (1 + alpha)
    regardless of the version expired half of what was generated)."""
    sched = RolloutScheduler(spec(n=2, groups=4, async_ratio=alpha, replicate=True), engines=2)
    world, source, trained, totals = async_run(sched, seed=0, fifo=True)
    assert totals.get("rollout/groups_expired", 0) == 0 and totals["rollout/tokens_wasted"] == 0
    pending = len(sched.flights) + len(sched.buffer)
    assert len(source.drawn) == len(trained) + pending
    # The most admitted ahead: P (1 + alpha) at a publication, P alone while a step trains.
    assert pending <= 4 + round(alpha * 4)


@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize("alpha", [1.5, 2.5])  # a fractional window's edge still trims groups (integer: rarely)
def test_an_expired_group_goes_back_to_the_queue_and_every_prompt_trains_once(alpha, drop):
    """Random finish orders make young groups overtake old ones; at a fractional window's edge some then
    expire (a batch waits for its groups at their last step, so elsewhere hardly any do). By default their
    prompts are admitted again first and train exactly once; with ``drop_expired`` they are lost, and
    counted. Either way every prompt drawn is accounted for, by the counters alone."""
    expired = 0
    for seed in range(8):
        sched = RolloutScheduler(spec(n=2, groups=4, async_ratio=alpha, replicate=True, drop_expired=drop), engines=2)
        world, source, trained, totals = async_run(sched, seed)
        expired += totals.get("rollout/groups_expired", 0)
        assert len(trained) == len(set(trained)) and totals["staleness/violations"] == 0
        pending = [f.group.prompt.uid for f in sched.flights.values()] + [g.prompt.uid for _, g in sched.buffer.entries]
        waiting = [p.uid for p in sched.requeued]
        drawn = [p.uid for p in source.drawn]
        if drop:
            assert not waiting and totals.get("rollout/groups_requeued", 0) == 0
            assert len(drawn) == len(trained) + len(pending) + totals.get("rollout/groups_dropped", 0)
        else:
            assert sorted(drawn) == sorted(trained + pending + waiting)  # each exactly once
            assert totals.get("rollout/groups_requeued", 0) == totals.get("rollout/groups_expired", 0)
        # A checkpoint keeps the prompts waiting to be admitted again, first.
        assert sched.state_dict()["admitted"][:len(waiting)] == waiting
    assert expired > 0  # the path was taken


@pytest.mark.parametrize("kw", [dict(async_ratio=1), dict(async_ratio=2, replicate=True), dict(redundancy=2),
                                dict(group_filter=GroupFilter(0.0), max_draws=9), dict(tail=TailSpec(1.5, 1.5)),
                                dict(async_ratio=1, lockstep=True),
                                dict(async_ratio=1, lockstep=True, group_filter=GroupFilter(0.0), max_draws=6)],
                         ids=["window1", "window2", "redundancy", "dynamic", "tail", "lockstep", "lockstep_dynamic"])
def test_every_generated_token_is_trained_held_or_counted_as_waste(kw):
    """The token counters tell the truth: whatever came back from an engine was trained, is still held by
    a group in flight or committed, or was counted in rollout/tokens_wasted (aborted, expired, filtered,
    redundant, cut, or regenerated)."""
    for seed in range(4):
        sched = RolloutScheduler(spec(n=2, groups=3, **kw), engines=2)
        world, _, _, totals = async_run(sched, seed, steps=8)
        held = sched.tokens_held
        assert totals["rollout/tokens_generated"] == totals["rollout/tokens_trained"] + \
            totals.get("rollout/tokens_wasted", 0) + held, (seed, totals)
        assert totals["rollout/tokens_trained"] > 0


@pytest.mark.parametrize("kw", [dict(async_ratio=1), dict(async_ratio=2, replicate=True),
                                dict(async_ratio=1, drop_expired=True), dict(redundancy=2),
                                dict(group_filter=GroupFilter(0.0), max_draws=9), dict(tail=TailSpec(1.5, 1.5)),
                                dict(async_ratio=1.5, lockstep=True),
                                dict(async_ratio=1, lockstep=True, group_filter=GroupFilter(0.0), max_draws=6)],
                         ids=["window1", "window2", "window_drop", "redundancy", "dynamic", "tail", "lockstep",
                              "lockstep_dynamic"])
def test_the_ledger_accounts_for_every_prompt_drawn(kw):
    """From the ledger's lines alone: each prompt drawn is trained, dropped (saying why) or pending, once per
    draw; a prompt admitted again is not a new draw. A ledger that lost a line no longer balances."""
    for seed in range(4):
        sched = RolloutScheduler(spec(n=2, groups=3, **kw), engines=2)
        world, source, trained, _ = async_run(sched, seed, steps=8)
        assert audit(world.ledger) == [], (seed, world.ledger)
        counts = summary(world.ledger)
        assert counts["drawn"] == len(source.drawn) and counts["trained"] == len(trained) == 24
        lines = [line for line in world.ledger if line.get("trained")]
        entry = lines[0]["trained"][0]
        assert set(entry) == {"uid", "group", "versions", "rewards", "lengths"} and len(entry["rewards"]) == 2
        broken = [{k: v for k, v in line.items() if k != "trained" or line is not lines[-1]} for line in world.ledger]
        assert audit(broken) != []
    assert audit([{"step": 1, "drawn": ["a"]}]) == ["the ledger has no pending line (written at each checkpoint "
                                                    "and at the run's end)"]


@pytest.mark.parametrize("kw", [dict(async_ratio=2, replicate=True),
                                dict(async_ratio=1, group_filter=GroupFilter(0.0), max_draws=9),
                                dict(tail=TailSpec(1.5, 1.5))], ids=["window2", "window_dynamic", "tail"])
def test_a_checkpoint_readmits_its_pending_prompts_and_the_resumed_ledger_balances(kw):
    """A run checkpointed mid-way, its ledger cut after the checkpoint's closing line (as --resume does), a
    fresh scheduler restored from the checkpoint: the joined ledger accounts for every prompt, those that
    dynamic sampling had rejected but kept for a fallback included."""
    filtered_at_checkpoint = False
    for seed in range(6):
        sched = RolloutScheduler(spec(n=2, groups=3, **kw), engines=2)
        world, source, _, _ = async_run(sched, seed=seed, steps=4)
        filtered_at_checkpoint |= bool(sched.filtered)
        _resume_and_audit(kw, sched, world, source)
    assert filtered_at_checkpoint or "group_filter" not in kw  # the path was taken


def _resume_and_audit(kw: dict, sched: RolloutScheduler, world, source) -> None:
    state, kept = sched.state_dict(), world.ledger  # the closing line is the checkpoint's
    assert kept[-1]["pending"] == state["admitted"] + state["long_queue"]
    fresh = RolloutScheduler(spec(n=2, groups=3, **kw), engines=2)
    fresh.load_state_dict(state, {p.uid: p for p in source.drawn}, step=4)
    fresh.on_published(4)  # the resumed run publishes the checkpoint's weights first
    later = World(fresh, random.Random(0), version=4)
    later.reward = world.reward
    lines = []
    for step in range(5, 9):
        later.run_until_ready(step, lambda k: source(k))
        lines.append(step_line(step, fresh.take_ledger()))
        later.publish(step)
    lines.append({**step_line(8, fresh.take_ledger()), "pending": fresh.pending_prompts()})
    assert set(lines[0].get("readmitted", [])) <= set(state["admitted"] + state["long_queue"])
    assert audit(kept + lines) == []
