"""The reward-call contract: data columns reach a function as keyword arguments, filtered by what its
signature takes, under the domain's kwargs and the per-request options; composites route them on."""

from gyre.rewards.base import RewardRequest, call_reward
from gyre.rewards.compose import shaped_reward

COLUMNS = {"difficulty": 3, "tests": {"n": 2}, "ground_truth": "shadow", "prompt": "shadow", "response": "shadow"}


def request(columns=COLUMNS, **kw):
    return RewardRequest("resp", "gt", prompt="question", tag="t", columns=dict(columns), **kw)


def plain(response, ground_truth):
    return float(response == "resp" and ground_truth == "gt")


def one_column(response, ground_truth, difficulty, *, scale=1.0):
    return difficulty * scale


def trl_names(completion, solution, difficulty=0):
    """Positional parameters named like TRL's: a column of that name must not collide with them."""
    return float(completion == "resp" and solution == "gt") + difficulty


def test_a_function_with_kwargs_gets_every_column_but_the_reserved_names():
    seen = {}

    def spy(response, ground_truth, **kwargs):
        seen.update(kwargs, args=(response, ground_truth))
        return 1.0

    assert call_reward(spy, request(), {}).score == 1.0
    # gyre's own prompt/tag/response/ground_truth win over columns of those names.
    assert seen == {"difficulty": 3, "tests": {"n": 2}, "prompt": "question", "tag": "t", "args": ("resp", "gt")}


def test_functions_get_only_the_columns_they_name():
    assert call_reward(plain, request(), {}).score == 1.0  # written without columns: still works
    assert call_reward(one_column, request(), {}).score == 3.0
    assert call_reward(trl_names, request(columns={"solution": "col", "difficulty": 1}), {}).score == 2.0
    # The domain's kwargs override a column of the same name, and per-request options override both.
    assert call_reward(one_column, request(), {"scale": 2.0, "difficulty": 5}).score == 10.0
    assert call_reward(one_column, request(options={"difficulty": 7}), {"difficulty": 5}).score == 7.0


def test_shaping_terms_and_their_base_each_get_their_columns():
    spec = "tests.rewards.test_base:"
    result = call_reward(shaped_reward, request(options={"scale": 2.0}),
                         {"base": spec + "one_column", "base_kwargs": {},
                          "terms": [{"function": spec + "plain", "kwargs": {}, "weight": 0.5},
                                    {"function": spec + "one_column", "kwargs": {}, "weight": 1.0}]})
    # base: 3 x 2 (the option is the base's); terms: 0.5 x 1 + 1 x 3 (no option for the terms).
    assert result.score == 6.0 + 0.5 + 3.0
    assert result.info["shaping"] == {"plain": 1.0, "one_column": 3.0}
