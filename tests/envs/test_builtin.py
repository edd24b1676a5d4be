"""The built-in environments: seeded episodes, rules, rewards, and what a bad action does."""

import pytest

from gyre.envs.builtin import FORMAT_PENALTY
from gyre.envs.builtin.frozen_lake import FrozenLake
from gyre.envs.builtin.guess import GuessNumber
from gyre.envs.builtin.python_math import MathQuestion, evaluate
from gyre.envs.builtin.sokoban import Sokoban
from gyre.envs.protocol import check_reset, check_step


def test_guess_number_bisection_always_wins():
    env = GuessNumber(1, 16)
    for seed in range(20):
        obs, _ = env.reset(seed)
        low, high, done, reward = 1, 16, False, 0.0
        while not done:
            guess = (low + high) // 2
            step = check_step(env.step(f"I guess \\boxed{{{guess}}}"))
            done, reward = step.done, step.reward
            if "higher" in step.observation:
                low = guess + 1
            elif "lower" in step.observation:
                high = guess - 1
        assert reward == 1.0 and env.turn <= 5
    env.reset(3)
    assert env.step("seven") == ("No guess in \\boxed{}: game over.", FORMAT_PENALTY, True, False,
                                 {"format_error": True})
    assert GuessNumber(1, 16).reset(4) == GuessNumber(1, 16).reset(4)  # the seed decides the number


def test_frozen_lake_maps_are_solvable_and_holes_end_the_episode():
    env = FrozenLake(size=4, hole_density=0.3)
    check_reset(env.reset(11))
    assert env.render().splitlines()[0][0] == "P" and env.render().splitlines()[-1][-1] == "G"
    env.grid = [list("SFFF"), list("HFFF"), list("FFFF"), list("FFFG")]
    step = check_step(env.step("\\boxed{down}"))
    assert step.terminated and step.reward == 0.0 and "hole" in step.observation
    env.reset(0)
    env.grid = [list("SFFF"), list("FFFF"), list("FFFF"), list("FFFG")]
    env.pos = (0, 0)
    for move in ["right"] * 3 + ["down"] * 2:
        assert not check_step(env.step(f"\\boxed{{{move}}}")).done
    last = check_step(env.step("\\boxed{d}"))
    assert last.terminated and last.reward == 1.0
    env.pos = (0, 0)
    assert check_step(env.step("\\boxed{up}")).observation.splitlines()[0][0] == "P"  # the edge: stays


def test_sokoban_rooms_are_scrambled_solvable_puzzles():
    env = Sokoban(6, 6, boxes=1, scramble=10)
    for seed in range(10):
        grid = env.reset(seed)[0].split("\n", 1)[1]
        assert env.boxes != env.targets and grid.count("P") + grid.count("p") == 1
    # A pushed box moves; a box against a wall does not.
    env.walls = {(r, c) for r in range(5) for c in range(5) if r in (0, 4) or c in (0, 4)}
    env.targets, env.boxes, env.player = {(1, 3)}, {(2, 3)}, (3, 3)
    assert check_step(env.step("\\boxed{up}")).reward == 1.0 and env.boxes == {(1, 3)}
    env.targets, env.boxes, env.player = {(2, 2)}, {(1, 2)}, (2, 2)
    check_step(env.step("\\boxed{up}"))
    assert env.boxes == {(1, 2)} and env.player == (2, 2)


def test_math_question_checks_the_boxed_integer():
    assert evaluate([3, 4, 5], ["+", "*"]) == 23 and evaluate([10, 2, 3], ["*", "-"]) == 17
    env = MathQuestion()
    obs, _ = env.reset(5)
    answer = env.answer
    assert check_step(env.step(f"\\boxed{{{answer}}}")).reward == 1.0
    env.reset(5)
    assert check_step(env.step(f"\\boxed{{{answer + 1}}}")).reward == 0.0


@pytest.mark.parametrize("env", [GuessNumber(), FrozenLake(), Sokoban(), MathQuestion()])
def test_every_builtin_returns_valid_records(env):
    check_reset(env.reset(0))
    check_step(env.step("\\boxed{1}"))
