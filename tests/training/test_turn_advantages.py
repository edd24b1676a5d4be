"""The advantage stage on hand-made multi-turn trajectories: turn-level estimators chosen by config, their
advantages on each turn's tokens (never on the prompt or the observations), and trajectory-level ones."""

import dataclasses

import pytest
import torch

from gyre.config.algorithm_schema import AlgorithmConfig
from gyre.data.batching import RowMap, TurnLayout, collate_groups
from gyre.training.advantage import AlgorithmState, estimate_advantages
from gyre.types import Group, PromptRecord, RewardResult, Segment, Trajectory, TurnRecord
from tests.training.test_advantage import sample, stage

PROMPT = [1, 2]
OBSERVATION = [7, 7]


def episode(index, turns, uid="env0"):
    """A scored multi-turn trajectory: for each (tokens, reward, state) a model turn of that many tokens,
    then a 2-token observation (none after the last turn). Its score is the sum of the turn rewards."""
    prompt = PromptRecord(uid, "obs", list(PROMPT), "")
    segments, records, pos = [], [], 0
    for i, (n, reward, state) in enumerate(turns):
        if i:
            segments.append(Segment(list(OBSERVATION), [0.0, 0.0], None, trainable=False))
            pos += len(OBSERVATION)
        segments.append(Segment([5] * n, [-1.0] * n, 0))
        records.append(TurnRecord(pos, pos + n, reward, state))
        pos += n
    score = sum(r for _, r, _ in turns)
    return Trajectory(prompt, index, segments, "", "eos", RewardResult(score), "scored", turns=records)


def group(uid, *trajectories):
    return Group(uid, trajectories[0].prompt, len(trajectories), 0, 0, list(trajectories))


def stepwise(groups, window=1):
    """The same episodes as step-level samples (one row per model turn, shown ``window`` turns before it)."""
    return [Group(g.group_id, g.prompt, g.size, g.seed, g.admitted_version,
                  [dataclasses.replace(t, window=window) for t in g.trajectories]) for g in groups]


def advantages(groups, multiple=1, **knobs):
    """Run the stage with an advantage section of ``knobs`` on a batch padded to ``multiple`` rows; returns
    the batch. (A run that learns from prompts refuses turn-level estimators, so the algorithm section is
    built on its own here.)"""
    _, plan = stage()
    a = AlgorithmConfig(advantage=knobs)
    batch, _ = collate_groups(groups, 0, multiple)
    estimate_advantages(batch, groups, a, plan, AlgorithmState.create(a), 16)
    return batch


def turn_values(batch, groups):
    """Per row, the advantage on each turn's tokens (asserting it is constant within the turn)."""
    rows = []
    for i, spans in enumerate(RowMap.of(groups).turns):
        values = []
        for _, start, end in spans:
            turn = batch.advantages[i, start:end]
            assert torch.allclose(turn, turn[0].expand_as(turn))
            values.append(turn[0].item())
        rows.append(values)
    return rows


def assert_only_model_tokens(batch, groups):
    """Prompt, observations and padding carry no advantage and no loss."""
    on_turns = torch.zeros_like(batch.advantages, dtype=torch.bool)
    for i, spans in enumerate(RowMap.of(groups).turns):
        for _, start, end in spans:
            on_turns[i, start:end] = True
    assert (batch.advantages[~on_turns] == 0).all()
    assert torch.equal(batch.response_mask.bool(), on_turns)


# GEM's guessing game (algorithms.md 4.1): -0.05 a guess, +1 on success; the second episode is truncated.
GEM = [group("g0", episode(0, [(2, -0.05, "a"), (3, -0.05, "b"), (1, 1.0, "c")])),
       group("g1", episode(0, [(1, -0.05, "a"), (2, -0.05, "d")], uid="env1"))]


def test_turn_layout_maps_offsets_like_collate():
    t = GEM[0].trajectories[0]
    layout, rows = TurnLayout.of(GEM), RowMap.of(GEM)
    # Response: turn [0, 2), observation [2, 4), turn [4, 7), observation [7, 9), turn [9, 10); prompt 2 tokens.
    assert rows.turns[0] == ((0, 2, 4), (1, 6, 9), (2, 11, 12)) and rows.trajectory == (0, 1)
    batch, _ = collate_groups(GEM, 0)
    for (_, start, end), turn in zip(rows.turns[0], t.turns):
        assert batch.input_ids[0, start:end].tolist() == t.response_ids[turn.start:turn.end]
        assert batch.response_mask[0, start:end].tolist() == [1.0] * (end - start)
    rewards, mask, states = layout.padded()
    assert rewards.tolist() == [pytest.approx([-0.05, -0.05, 1.0]), pytest.approx([-0.05, -0.05, 0.0])]
    assert mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert states[0].tolist() == [0, 1, 2] and states[1, :2].tolist() == [0, 3]  # "a" is one state


def test_turn_layout_refuses_bad_turns_and_gives_unknown_states_their_own_id():
    t = episode(0, [(2, 0.0, ""), (2, 0.0, "")])
    layout = TurnLayout.of([group("g", t)])
    _, _, states = layout.padded()
    assert states[0, 0] != states[0, 1]  # unknown ("") states anchor nothing
    t.turns[1].start = 1
    with pytest.raises(ValueError, match=r"env0#0: turn \[1, 6\) overlaps the turn before it"):
        TurnLayout.of([group("g", t)])


def test_step_returns_on_each_turns_tokens():
    # gamma 0.9: [0.715, 0.85, 1.0] and [-0.095, -0.05] (algorithms.md 4.1), no baseline.
    batch = advantages(GEM, estimator="step_returns", norm_mean="none", norm_std="none", gamma=0.9)
    assert turn_values(batch, GEM) == [pytest.approx([0.715, 0.85, 1.0]), pytest.approx([-0.095, -0.05])]
    assert_only_model_tokens(batch, GEM)


@pytest.mark.parametrize("ddof,expected", [
    (0, [[0.4984, 0.7897, 1.1134], [-1.2493, -1.1522]]),  # GEM's numbers: mean 0.484, std 0.4635
    (1, [[0.4458, 0.7063, 0.9958], [-1.1174, -1.0306]]),  # std 0.5182
])
def test_rebn_normalises_over_every_turn_of_the_batch(ddof, expected):
    batch = advantages(GEM, estimator="rebn", norm_mean="none", norm_std="none", gamma=0.9, std_ddof=ddof)
    assert turn_values(batch, GEM) == [pytest.approx(row, abs=1e-4) for row in expected]
    assert_only_model_tokens(batch, GEM)


# GiGPO's example (algorithms.md 4.2): one group from s0, returns R = [1, 0, 1].
GIGPO = [group("g0", episode(0, [(2, 0.0, "s0"), (1, 1.0, "s1")]),
               episode(1, [(1, 0.0, "s0"), (2, 0.0, "s2"), (1, 0.0, "s2")]),
               episode(2, [(3, 0.0, "s0"), (1, 0.0, "s1"), (2, 1.0, "s3")]))]


def test_gigpo_worked_example():
    # A^E (group scopes, ddof 0) [0.7071, -1.4142, 0.7071] + A^S: anchor s0 [0.7607, -1.4128, 0.6521],
    # anchor s1 (returns 1 and 0.95) +-1, s2 and s3 0.
    batch = advantages(GIGPO, estimator="gigpo", std_ddof=0)
    got = turn_values(batch, GIGPO)
    assert [row[0] for row in got] == pytest.approx([1.4678, -2.8270, 1.3592], abs=1e-4)
    assert got == [pytest.approx(row, abs=1e-4) for row in
                   [[1.4678, 1.7071], [-2.8270, -1.4142, -1.4142], [1.3592, -0.2929, 0.7071]]]
    assert_only_model_tokens(batch, GIGPO)


def test_gigpo_std_free_and_weights():
    # norm_std none: A^E = R - 2/3 = [1/3, -2/3, 1/3], A^S = deviations [0.3325, -0.6175, 0.285] at s0;
    # weights w_E 2, w_S 0.5 at step 0: [0.8329, -1.6421, 0.8092].
    batch = advantages(GIGPO, estimator="gigpo", norm_std="none", gigpo={"episode_weight": 2.0, "step_weight": 0.5})
    assert [row[0] for row in turn_values(batch, GIGPO)] == pytest.approx([0.83292, -1.64208, 0.80917], abs=1e-4)


def test_chunk_returns_ipa_example_and_group_normalised():
    # Unnormalised (norm none): 4 chunks, R 1, gamma 0.9 -> [0.729, 0.81, 0.9, 1.0]; R 0 -> 0.
    groups = [group("g0", episode(0, [(1, 0.0, "a"), (2, 0.0, "b"), (1, 0.0, "c"), (2, 1.0, "d")]),
                    episode(1, [(2, 0.0, "a"), (1, 0.0, "e")]))]
    batch = advantages(groups, estimator="chunk_returns", norm_mean="none", norm_std="none", gamma=0.9)
    assert turn_values(batch, groups) == [pytest.approx([0.729, 0.81, 0.9, 1.0]), [0.0, 0.0]]
    # Group scopes (ddof 1): R = [1, 0] -> +-0.70711, discounted back from each trajectory's last turn.
    batch = advantages(groups, estimator="chunk_returns", gamma=0.9)
    assert turn_values(batch, groups) == [pytest.approx([0.51548, 0.57276, 0.6364, 0.70711], abs=1e-5),
                                          pytest.approx([-0.6364, -0.70711], abs=1e-5)]
    assert_only_model_tokens(batch, groups)


@pytest.mark.parametrize("steps", [False, True])
def test_trajectory_level_grpo_on_a_multi_turn_group(steps):
    # The episode return is the trajectory's reward: R = [1, 0] -> +-0.70711 on every model token of the
    # trajectory (the outcome is carried back over the observations, which get nothing); as step-level
    # samples, on every turn's row.
    groups = [group("g0", episode(0, [(2, 0.5, "a"), (3, 0.5, "b")]), episode(1, [(1, 0.0, "a"), (2, 0.0, "c")]))]
    if steps:
        groups = stepwise(groups)
        batch = advantages(groups, estimator="reinforce")
        assert turn_values(batch, groups) == [[pytest.approx(x, abs=1e-5)] for x in [0.70711] * 2 + [-0.70711] * 2]
        assert_only_model_tokens(batch, groups)
        return
    batch = advantages(groups, estimator="reinforce")
    assert turn_values(batch, groups) == [pytest.approx([0.70711] * 2, abs=1e-5),
                                          pytest.approx([-0.70711] * 2, abs=1e-5)]
    assert_only_model_tokens(batch, groups)


@pytest.mark.parametrize("window", [0, 1, 2])
def test_step_level_rows_get_the_advantages_their_turns_get_in_the_whole_trajectory(window):
    # GEM's step returns (gamma 0.9), one row per turn, padded to 8 rows (the padding trains nothing).
    steps = stepwise(GEM, window)
    batch = advantages(steps, multiple=8, estimator="step_returns", norm_mean="none", norm_std="none", gamma=0.9)
    assert len(batch) == 8 and batch.response_mask[5:].sum() == 0 and batch.advantages[5:].abs().sum() == 0
    assert turn_values(batch, steps) == [[pytest.approx(x)] for x in (0.715, 0.85, 1.0, -0.095, -0.05)]
    assert_only_model_tokens(batch, steps)


def test_a_single_turn_batch_is_refused_by_turn_estimators():
    groups = [group("p0", sample(0, 0, 1.0, 2), sample(0, 1, 0.0, 2))]
    with pytest.raises(ValueError, match=r"estimator=rebn assigns credit to the turns of multi-turn episodes, but 2 "
                                         r"of 2 trajectories have no turns \(e.g. p0#0.*\(reinforce, rloo, "
                                         r"group_centred_batch_std, gae, remax, opo, pass_at_k, gpg\)"):
        advantages(groups, estimator="rebn", norm_mean="none", norm_std="none")


def test_the_overlong_penalty_measures_an_episodes_longest_turn():
    # Turn budget 4, L_cache 0.5 x 4 = 2: an episode whose longest turn has 3 tokens gets (2 - 3) / 2 = -0.5,
    # though its 10 response tokens (observations included) would be far past the budget; one of 2-token
    # turns gets nothing.
    _, plan = stage("algorithm.masks.overlong_penalty_frac=0.5", max_new=4)
    groups = [group("g0", episode(0, [(2, 1.0, "a"), (3, 0.0, "b")]), episode(1, [(2, 1.0, "a"), (2, 0.0, "c")]))]
    a = AlgorithmConfig(advantage={"estimator": "reinforce", "norm_mean": "none", "norm_std": "none"})
    batch, _ = collate_groups(groups, 0)
    metrics = estimate_advantages(batch, groups, a, plan, AlgorithmState.create(a), 4)
    assert batch.scores.tolist() == [0.5, 1.0] and metrics["reward/overlong_penalty"] == -0.25
