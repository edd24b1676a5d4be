"""Code test sets in the layouts public datasets ship (MBPP, APPS, HumanEval, two columns) run as the code
reward's two forms; a malformed one is an error naming what is wrong."""

import json

import pytest

from gyre.rewards.code import check_ground_truth, code_reward
from gyre.rewards.code_tests import canonical_tests
from gyre.rewards.sandbox.probe import capabilities

ADD = "```python\ndef add(a, b):\n    return a + b\n```"
WRONG = "```python\ndef add(a, b):\n    return a - b\n```"


def test_each_layout_maps_onto_asserts_or_stdin_tests():
    assert canonical_tests(["assert add(1, 2) == 3"]) == {"asserts": ["assert add(1, 2) == 3"]}
    apps = {"input_output": json.dumps({"inputs": [[1, 2], [0, 0]], "outputs": [[3], 0], "fn_name": "add"})}
    assert canonical_tests(apps) == {"asserts": ["assert add(1, 2) in [[3], 3]", "assert add(0, 0) in [0]"]}
    stdin = {"input_output": json.dumps({"inputs": ["1 2\n"], "outputs": [["3"]]})}
    assert canonical_tests(stdin) == {"inputs": ["1 2\n"], "outputs": ["3"]}
    human = {"test": "def check(candidate):\n    assert candidate(1, 2) == 3\n", "entry_point": "add"}
    assert canonical_tests(human) == {"asserts": [human["test"] + "\n\ncheck(add)\n"]}
    for bad, message in (({"test": "x", "entry_point": "not a name"}, "'entry_point' must be a function name"),
                         ({"inputs": [[1]], "outputs": [], "fn_name": "f"}, "equally long"),
                         ({"input_output": "{"}, "'input_output' is not valid JSON")):
        with pytest.raises(ValueError, match=message):
            check_ground_truth(json.dumps(bad))
    with pytest.raises(ValueError, match="or a layout of docs/guides/rewards.md#code-tests"):
        check_ground_truth(json.dumps({"cases": [1]}))


@pytest.mark.skipif(not capabilities().contained, reason="no kernel sandbox on this machine")
@pytest.mark.parametrize("ground_truth", [
    ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"],
    {"input_output": json.dumps({"inputs": [[1, 2], [-1, 1]], "outputs": [[3], [0]], "fn_name": "add"})},
    {"test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n",
     "entry_point": "add"},
], ids=["mbpp", "apps_calls", "humaneval"])
def test_a_right_program_passes_and_a_wrong_one_fails(ground_truth):
    text = json.dumps(ground_truth)
    assert code_reward(ADD, text).score == 1.0
    assert code_reward(WRONG, text).score == 0.0
