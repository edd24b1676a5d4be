"""gem-llm environments by id, hosted like any other (the ``gem`` extra; installed in CI)."""

import pytest

from gyre.envs.host import EnvSlot, EnvSpec
from gyre.envs.protocol import EnvError, EnvReset, EnvStep, make_env

pytest.importorskip("gem")


def test_guess_the_number_plays_through_the_host():
    slot = EnvSlot(EnvSpec("gem:game:GuessTheNumber-v0-easy", {}))
    first = slot.reset(3, 60)
    assert isinstance(first, EnvReset) and "Guess The Number" in first.observation
    seen = []
    for guess in range(1, 11):
        step = slot.step(f"\\boxed{{{guess}}}", 10)
        assert isinstance(step, EnvStep)
        seen.append(step.reward)
        if step.done:
            break
    assert step.done and all(isinstance(r, float) for r in seen)
    again = slot.reset(3, 60)
    assert again.observation == first.observation  # the seed decides the game
    slot.close()


def test_sudoku_rejects_a_turn_without_an_answer():
    env = make_env("gem:game:Sudoku-v0-easy", {})
    obs, _ = env.reset(1)
    assert "Sudoku" in obs
    step = env.step("I am not sure")
    assert step[2] and step[1] < 0  # GEM's format penalty ends the episode


def test_an_unknown_id_is_a_clear_error():
    with pytest.raises(EnvError, match="gem could not make 'game:NoSuchGame-v0'"):
        make_env("gem:game:NoSuchGame-v0", {})
