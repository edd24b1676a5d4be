"""One episode's state machine with a real (character) tokenizer: what each turn is shown, what the
trajectory records, and the rows it trains, whole or per turn (step-level samples with a history window)."""

from __future__ import annotations

import pytest

from gyre.data.batching import collate_groups
from gyre.envs.context import ContextBuilder
from gyre.envs.episode import Episode, EpisodeLimits
from gyre.envs.protocol import EnvError, EnvReset, EnvStep
from gyre.models.presets import build_char_tokenizer
from gyre.types import GenerationResult, Group, PromptRecord, SamplingParams

TOKENIZER = build_char_tokenizer()
BUILDER = ContextBuilder(TOKENIZER, use_template=False)


def ids(text: str) -> list[int]:
    return list(TOKENIZER(text, add_special_tokens=False)["input_ids"])


def play(window: int | None, actions=("a1", "b22", "c333"), observations=("o1", "o2"), context_tokens=400):
    """Play ``actions`` (turns sampled at versions 0, 1, 2...) against scripted observations; returns the
    episode and the context each turn was shown."""
    limits = EpisodeLimits(max_turns=len(actions), turn_tokens=8, context_tokens=context_tokens, window=window)
    episode = Episode("g/0", PromptRecord("env0", "", [], ""), 0, 7, limits, SamplingParams(), BUILDER)
    request, shown = episode.on_reset(EnvReset("start")), []
    for turn, action in enumerate(actions):
        shown.append(list(request.prompt_ids))
        response = ids(action)
        episode.on_turn(GenerationResult(request.request_id, 0, request.prompt_ids, response, action,
                                         [-0.5] * len(response), "stop", [turn] * len(response)))
        last = turn == len(actions) - 1
        request = episode.on_step(EnvStep("end" if last else observations[turn], 1.0 if last else 0.0, last, False))
        if request is None:
            break
    return episode, shown


def text(token_ids) -> str:
    return TOKENIZER.decode(token_ids, skip_special_tokens=True)


def test_a_trajectory_turn_sees_the_whole_conversation_and_trains_as_one_row():
    episode, shown = play(None)
    first = BUILDER.first("start")
    assert [text(s) for s in shown] == [text(first), text(first) + "a1\no1\n", text(first) + "a1\no1\nb22\no2\n"]
    t = episode.trajectory()
    assert t.rows() == [(0, 0, len(t.response_ids))] and t.window is None
    batch, _ = collate_groups([Group("g", t.prompt, 1, 7, 0, [t])], pad_id=0)
    assert len(batch) == 1 and batch.response_mask.sum() == len("a1b22c333")


@pytest.mark.parametrize("window,expected", [
    (1, ["", "a1\no1\n", "b22\no2\n"]),  # the turn before, with the observation that followed it
    (2, ["", "a1\no1\n", "a1\no1\nb22\no2\n"]),
    (0, ["", "\no1\n", "\no2\n"]),  # only the latest observation (with the newline that closes the turn)
])
def test_a_step_level_turn_sees_the_first_observation_and_its_window(window, expected):
    episode, shown = play(window)
    first = text(BUILDER.first("start"))
    assert [text(s) for s in shown] == [first + e for e in expected]
    t = episode.trajectory()
    assert t.window == window and len(t.rows()) == 3
    # The trained-equals-sampled check: each row is exactly what its turn was shown, then the tokens it sampled.
    batch, _ = collate_groups([Group("g", t.prompt, 1, 7, 0, [t])], pad_id=0, multiple=4)
    assert len(batch) == 4  # three turns and one padding row
    for row, (context, turn) in enumerate(zip(shown, ("a1", "b22", "c333"))):
        n = int(batch.attention_mask[row].sum())
        assert batch.input_ids[row, :n].tolist() == context + ids(turn)
        assert batch.response_mask[row].nonzero().flatten().tolist() == list(range(len(context), n))
        assert batch.versions[row, len(context):n].tolist() == [row] * len(turn)
        assert batch.rollout_logprobs[row, len(context):n].tolist() == [-0.5] * len(turn)
    assert batch.attention_mask[3].tolist()[:2] == [1, 0] and batch.response_mask[3].sum() == 0


def test_the_context_limit_bounds_one_turns_view_with_a_window():
    """A whole conversation of this length ends for its context limit; a window of one turn keeps playing."""
    actions = ("a1", "b22", "c333", "d4444", "e5")
    observations = ("o1", "o2", "o3", "o4")
    whole, _ = play(None, actions, observations, context_tokens=30)
    windowed, shown = play(1, actions, observations, context_tokens=30)
    assert whole.end == "context" and len(whole.turns) < 5
    assert windowed.end == "terminated" and len(windowed.turns) == 5 and max(map(len, shown)) < 30


def test_a_turn_of_n_samples_records_the_one_the_environment_chose_and_wastes_the_others():
    limits = EpisodeLimits(max_turns=3, turn_tokens=8, context_tokens=400)
    episode = Episode("g/0", PromptRecord("env0", "", [], ""), 0, 7, limits, SamplingParams(), BUILDER)
    ask = {"messages": [{"role": "user", "content": "q"}], "sampling": {"n": 3}}
    request = episode.on_reset(EnvReset(ask))
    assert request.n == 3 and episode.samples == 3
    texts = ["x", "yy", "zzz"]
    results = [GenerationResult(request.request_id, i, request.prompt_ids, ids(t), t, [-0.1 * (i + 1)] * len(t),
                                "stop", [0] * len(t)) for i, t in enumerate(texts)]
    assert episode.on_turns(results) == texts and episode.unrecorded == 6 and not episode.segments
    with pytest.raises(EnvError, match="info\\['choice'\\]=3"):
        episode.on_step(EnvStep("o", 0.0, False, False, {"choice": 3}))
    request = episode.on_step(EnvStep("o", 0.0, False, False, {"choice": 1}))
    assert request.n == 1 and episode.wasted == len("x") + len("zzz") and episode.unrecorded == 0
    trained = [s for s in episode.segments if s.trainable]
    assert [s.token_ids for s in trained] == [ids("yy")] and trained[0].logprobs == [-0.2, -0.2]
    assert request.prompt_ids[-len(ids("yy\no\n")):] == ids("yy\no\n")  # the next turn is shown the chosen one
