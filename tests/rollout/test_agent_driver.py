"""Agent episodes on real engines: tiny-model engines in process (recording every turn they sample), the agent
program in environment workers (Ray actors) talking to the endpoint through the openai client. What trains is,
turn for turn, what the engines sampled: ids and log-probs."""

import pytest

pytest.importorskip("openai")

from gyre.cluster.env_pool import EnvPool  # noqa: E402
from gyre.cluster.group import RoleGroup  # noqa: E402
from gyre.cluster.reward_pool import RewardPool  # noqa: E402
from gyre.cluster.workers import EnvWorker, RolloutWorker  # noqa: E402
from gyre.data.batching import collate_groups  # noqa: E402
from gyre.envs.context import ContextBuilder  # noqa: E402
from gyre.envs.episode import EpisodeLimits  # noqa: E402
from gyre.envs.host import EnvSpec  # noqa: E402
from gyre.models.loading import load_tokenizer  # noqa: E402
from gyre.rollout.driver import RolloutDriver  # noqa: E402
from gyre.rollout.episodes import EpisodeRunner  # noqa: E402
from gyre.rollout.scheduler import RolloutScheduler, ScheduleSpec  # noqa: E402
from gyre.types import PromptRecord, SamplingParams  # noqa: E402
from tests.chat_models import with_chat_template  # noqa: E402
from tests.envs.test_agent import AGENTS  # noqa: E402
from tests.envs.test_context import TOOL_TEMPLATE  # noqa: E402
from tests.rollout.test_env_driver import engine_args  # noqa: E402

SAMPLED: dict = {}
"""(Request id, sample index) -> (ids, log-probs) of every turn the engines returned."""


class RecordingRolloutWorker(RolloutWorker):
    """A rollout worker whose engine's every finished sample is recorded as it leaves the engine."""

    def _engine(self):
        return _Recording(self.engine)


class _Recording:
    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def step(self):
        results = self._engine.step()
        for r in results:
            SAMPLED[r.request_id, r.sample_index] = (list(r.response_ids), list(r.logprobs))
        return results


@pytest.mark.parametrize("n", [1, 3])
def test_agent_turns_train_exactly_what_the_engines_sampled(ray_local, tiny_model_dir, tmp_path, n):
    """With n = 3 the agent's first request asks for three choices and goes on with the last: that one trains."""
    model = with_chat_template(tiny_model_dir, tmp_path / "model", TOOL_TEMPLATE)
    SAMPLED.clear()
    engines = RoleGroup.local("rollout", RecordingRolloutWorker, [engine_args(model, r) for r in range(2)])
    kwargs = {"tasks": f"{AGENTS}:tasks", "entry": f"{AGENTS}:{'two_turn_agent' if n == 1 else 'last_of_3_agent'}",
              "turn_timeout_s": 20.0}
    workers = RoleGroup.create_unplaced("env", EnvWorker, 1, 0.25, (EnvSpec("gyre:agent", kwargs), 4, 30.0, 30.0))
    pool = EnvPool(workers, per_worker=4, deadline_s=30.0)
    sampling = SamplingParams(max_new_tokens=8)
    runner = EpisodeRunner(pool.slots, ContextBuilder(load_tokenizer(model), use_template=True),
                           EpisodeLimits(max_turns=3, turn_tokens=8, context_tokens=400), sampling)
    sched = RolloutScheduler(ScheduleSpec(2, 2, sampling, run_seed=3, replicate=True), engines=2, source=runner)
    source = iter([PromptRecord(f"t{i}", "", [], str(i)) for i in range(20)])
    sched.admit(1, lambda k: [next(source) for _ in range(k)])
    driver = RolloutDriver(engines, RewardPool({}), emit_every=1, envs=pool)
    try:
        driver.run(sched, lambda: sched.ready(1))
        batch = sched.take(1)
    finally:
        driver.close()
        pool.close()
        engines.kill()
        workers.kill()
    rows, _ = collate_groups(batch, pad_id=0)
    row, unchosen = 0, 0
    for group in batch:
        for t in group.trajectories:
            key = f"{group.group_id}/{t.sample_index}"
            turns = [SAMPLED[f"{key}#0", n - 1], SAMPLED[f"{key}#1", 0]]
            unchosen += sum(len(SAMPLED[f"{key}#0", i][0]) for i in range(n - 1))
            assert all((f"{key}#0", i) in SAMPLED for i in range(n)) and len(t.turns) == 2
            assert len(turns) == 2  # the agent asks twice
            for turn, (ids, _) in zip(t.turns, turns):
                assert t.response_ids[turn.start:turn.end] == ids
            assert [s.logprobs for s in t.segments if s.trainable] == [lp for _, lp in turns]
            mask = rows.response_mask[row].bool()
            assert rows.input_ids[row][mask].tolist() == turns[0][0] + turns[1][0]
            assert rows.rollout_logprobs[row][mask].tolist() == pytest.approx(turns[0][1] + turns[1][1])
            row += 1
    assert sched.stats.get("rollout/tokens_wasted", 0) >= unchosen and (unchosen > 0) == (n > 1)
