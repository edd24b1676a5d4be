"""The code reward with real sandboxed runs, and RollPacker's adaptive timeout (pure)."""

from __future__ import annotations

import json

import pytest

from gyre.rewards.code import AdaptiveTimeout, check_ground_truth, code_reward, extract_code
from gyre.types import RewardResult

IO = json.dumps({"inputs": ["1 2\n", "3 4\n", "10 -5\n"], "outputs": ["3\n", "7", "5\n\n"]})
ASSERTS = json.dumps({"asserts": ["assert add(1, 2) == 3", "assert add(3, 4) == 7", "assert add(10, -5) == 5"],
                      "setup": "from typing import List"})
FAST = {"timeout_s": 2.0}


def fenced(code: str, lang: str = "python") -> str:
    return f"Here is my solution.\n```{lang}\n{code}\n```\nIt adds the numbers."


# --- extract_code --------------------------------------------------------------------------------------


def test_extract_code_takes_the_last_python_block():
    response = "```python\nfirst()\n```\ntext\n```py\nsecond()\n```\n```text\nnot code\n```"
    assert extract_code(response) == "second()"
    assert extract_code("```\nbare()\n```") == "bare()"
    assert extract_code("```python3 title=x\na = 1\n```") == "a = 1"


def test_extract_code_falls_back_and_handles_odd_fences():
    assert extract_code("print(1)") == "print(1)"
    assert extract_code("```cpp\nint main() {}\n```") == "```cpp\nint main() {}\n```"
    assert extract_code("Sure:\n```python\nx = 1\nprint(x)") == "x = 1\nprint(x)"  # cut off by the token limit
    assert extract_code("1. Code:\n   ```python\n   if x:\n       y()\n   ```") == "if x:\n    y()"


# --- stdin/stdout tests --------------------------------------------------------------------------------


def test_io_correct_wrong_and_trailing_whitespace():
    good = code_reward(fenced("a, b = map(int, input().split())\nprint(a + b, ' ')"), IO, **FAST)
    assert (good.score, good.correct, good.status) == (1.0, True, "ok")
    assert good.info["passed"] == good.info["total"] == 3 and good.info["statuses"] == ["pass"] * 3
    assert len(good.info["runtimes"]) == 3 and all(t > 0 for t in good.info["runtimes"])
    assert good.info["timeout_s"] == 2.0
    wrong = code_reward(fenced("a, b = map(int, input().split())\nprint(a * b)"), IO, **FAST)
    assert (wrong.score, wrong.correct) == (0.0, False)
    assert wrong.info["statuses"] == ["wrong"]  # stops at the first failure


def test_io_partial_credit_runs_every_test():
    almost = fenced("a, b = map(int, input().split())\nprint(a + b if a < 10 else 0)")
    result = code_reward(almost, IO, partial_credit=True, **FAST)
    assert result.score == pytest.approx(2 / 3) and result.correct is False
    assert result.info["statuses"] == ["pass", "pass", "wrong"] and len(result.info["runtimes"]) == 3


def test_io_syntax_error_crash_and_no_code():
    bad = code_reward(fenced("print(("), IO, **FAST)
    assert bad.score == 0.0 and bad.info["statuses"] == ["error"] and "SyntaxError" in bad.info["detail"]
    crash = code_reward(fenced("raise SystemExit(2)"), IO, **FAST)
    assert crash.score == 0.0 and crash.info["statuses"] == ["error"]
    empty = code_reward("I don't know.\n```python\n```", IO, **FAST)
    assert empty.score == 0.0 and empty.info["runtimes"] == []


def test_a_program_that_is_not_valid_unicode_scores_zero_with_the_reason():
    """A lone surrogate (a policy can emit one) made the reward raise, which counts toward max_error_frac."""
    for tests in (IO, ASSERTS):
        result = code_reward(fenced("def add(a, b):\n    return a + b  # \ud800"), tests, **FAST)
        assert (result.score, result.correct, result.info["passed"], result.info["total"]) == (0.0, False, 0, 3)
        assert "not valid Unicode text (surrogates not allowed at character" in result.info["detail"]


def test_io_adversarial_programs_score_zero():
    loop = code_reward(fenced("while True:\n    pass"), IO, timeout_s=0.5)
    assert loop.score == 0.0 and loop.info["statuses"] == ["timeout"] and loop.info["runtimes"][0] < 1.5
    snoop = code_reward(fenced("import glob\nprint(glob.glob('/tmp/**', recursive=True))"), IO, **FAST)
    assert snoop.score == 0.0 and snoop.info["statuses"] == ["wrong"]  # its /tmp is its own, empty work dir
    flood = code_reward(fenced("while True:\n    print(3)"), IO, **FAST)
    assert flood.score == 0.0 and flood.info["statuses"] == ["error"]


def test_io_deep_recursion_in_a_thread_is_allowed():
    # a common competitive-programming idiom: a big thread stack for deep recursion
    src = ("import sys, threading\nsys.setrecursionlimit(10**6)\nthreading.stack_size(2**26)\n"
           "def depth(n):\n    return 0 if n == 0 else 1 + depth(n - 1)\n"
           "def main():\n    a, b = map(int, input().split())\n    print(depth(a) + b)\n"
           "t = threading.Thread(target=main)\nt.start()\nt.join()")
    assert code_reward(fenced(src), IO, **FAST).score == 1.0


# --- assert tests --------------------------------------------------------------------------------------


def test_asserts_correct_wrong_and_partial():
    good = code_reward(fenced("def add(a: int, b: int) -> int:\n    return a + b"), ASSERTS, **FAST)
    assert (good.score, good.correct, good.info["passed"]) == (1.0, True, 3)
    wrong = code_reward(fenced("def add(a, b):\n    return a - b"), ASSERTS, **FAST)
    assert (wrong.score, wrong.info["statuses"]) == (0.0, ["wrong"])
    assert "assert add(1, 2) == 3: failed with add(1, 2) = -1" in wrong.info["detail"]
    partial = code_reward(fenced("def add(a, b):\n    return a + b if b > 0 else 0"), ASSERTS, partial_credit=True,
                          **FAST)
    assert partial.score == pytest.approx(2 / 3) and partial.info["statuses"] == ["pass", "pass", "wrong"]
    crash = code_reward(fenced("def add(a, b):\n    raise ValueError('no')"), ASSERTS, **FAST)
    assert crash.score == 0.0 and "ValueError: no" in crash.info["detail"]
    assert "unsplit" not in good.info  # every assert was compared outside the sandbox


def test_asserts_ignore_a_main_block_and_use_setup():
    code = ("def add(a: int, b: int) -> int:\n    return a + b\n\nxs: List[int] = []\n"
            "if __name__ == '__main__':\n    print(add(*map(int, input().split())))")
    assert code_reward(fenced(code), ASSERTS, **FAST).score == 1.0


def test_asserts_syntax_error_scores_zero():
    result = code_reward(fenced("def add(a, b)\n    return a + b"), ASSERTS, **FAST)
    assert result.score == 0.0 and result.info["statuses"] == ["error"] and "SyntaxError" in result.info["detail"]


@pytest.mark.parametrize("cheat", [
    "import sys\ndef add(a, b):\n    return 0\nsys.exit(0)",
    "import os\ndef add(a, b):\n    return 0\nos._exit(0)",
    "def add(a, b):\n    return 0\nexit()",
    "def add(a, b):\n    return 0\nraise SystemExit",
    "import atexit, os\natexit.register(os._exit, 0)\ndef add(a, b):\n    return 0",
    "import os\nprint(open(os.path.join(os.path.dirname(os.getcwd()), 'solution.py')).read())\nos._exit(0)",
    # the classic hacks of asserts compared inside the sandbox
    "class A:\n    def __eq__(self, o):\n        return True\n    __ne__ = lambda s, o: False\n"
    "def add(a, b):\n    return A()",
    "import builtins\nbuiltins.AssertionError = type('Never', (BaseException,), {})\ndef add(a, b):\n    return 0",
    "class I(int):\n    def __eq__(self, o):\n        return True\ndef add(a, b):\n    return I(0)",
    # forging the result channel: it still has to contain the right values
    "import os, json\nos.write(4, json.dumps([{'v': ['b', True]}] * 3).encode())\nos._exit(0)",
    # reading the expected value from its own program: it is not there
    "import sys, re\nsrc = open('/sandbox/solution.py').read()\n"
    "def add(a, b):\n    return int((re.findall(r'== (\\d+)', src) or ['0'])[0])",
], ids=["sys.exit", "os._exit", "exit", "SystemExit", "atexit", "read-own-source", "always-equal", "rebind-builtin",
        "int-subclass-eq", "forge-channel", "expected-from-source"])
def test_asserts_cannot_be_gamed(cheat):
    result = code_reward(fenced(cheat), ASSERTS, partial_credit=True, **FAST)
    assert result.score == 0.0 and result.correct is False and "pass" not in result.info["statuses"], result.info


def test_asserts_against_a_setup_reference_cannot_be_changed_by_the_program():
    gt = json.dumps({"setup": "def ref(n):\n    return n * n", "asserts": ["assert square(3) == ref(3)",
                                                                            "assert abs(square(2) - ref(2)) < 1e-9"]})
    assert code_reward(fenced("def square(n):\n    return n ** 2"), gt, **FAST).score == 1.0
    cheat = "def ref(n):\n    return 0\ndef square(n):\n    return 0"  # rebinds the reference
    assert code_reward(fenced(cheat), gt, partial_credit=True, **FAST).score == 0.0


@pytest.mark.parametrize("test, passes", [
    ("assert sorted(evens(6)) == [0, 2, 4]", True),
    ("assert list(evens(6)) == [0, 2, 4] and len(evens(4)) == 2", True),
    ("assert math.isclose(half(3), 1.5) and not evens(0)", True),
    ("assert evens(6)[1:] == [2, 4]\nassert set(evens(3)) == {0, 2}", True),
    ("assert half(1) == 0.5 if evens(2) else False", True),
    ("assert isinstance(evens(2), list) and type(half(2)) is float", True),
    ("assert evens(6) == [0, 2, 4, 6]", False),
    ("assert all(x % 2 == 0 for x in evens(6))", True),  # unsplittable: compared inside the sandbox
    ("def check(candidate):\n    assert candidate(4) == [0, 2]\n    assert candidate(0) == []\ncheck(evens)", True),
])
def test_assert_forms(test, passes):
    gt = json.dumps({"setup": "import math", "asserts": [test]})
    code = "def evens(n):\n    return [i for i in range(n) if i % 2 == 0]\ndef half(x):\n    return x / 2"
    result = code_reward(fenced(code), gt, **FAST)
    assert result.correct is passes, result.info
    assert result.info.get("unsplit", 0) == (1 if "for x in" in test else 0)


def test_results_that_are_not_plain_data_fail():
    gt = json.dumps({"asserts": ["assert gen(2) == [0, 1]", "assert list(gen(2)) == [0, 1]"]})
    result = code_reward(fenced("def gen(n):\n    yield from range(n)"), gt, partial_credit=True, **FAST)
    assert result.info["statuses"] == ["wrong", "pass"]  # a generator is not data; list() of it is
    assert "cannot be compared outside the sandbox" in result.info["detail"]


def test_sample_deadline_is_derived_from_the_sandbox_limits():
    assert code_reward.deadline_s(ASSERTS, timeout_s=2.0) == pytest.approx(3 * (2.0 + 2.0) + 5.0)
    assert code_reward.deadline_s(IO) == pytest.approx(3 * (10.0 + 2.0) + 5.0)
    adaptive = AdaptiveTimeout(t_min=1.0, t_max=4.0).to_dict()
    assert code_reward.deadline_s(IO, adaptive=adaptive) == pytest.approx(3 * (4.0 + 2.0) + 5.0)
    assert code_reward.deadline_s("not json") is None


# --- ground truth --------------------------------------------------------------------------------------


@pytest.mark.parametrize("gt, message", [
    ("not json", "not valid JSON"),
    ("[1, 2]", "either"),
    ('{"inputs": ["1"], "asserts": ["assert 1"]}', "either"),
    ('{"inputs": ["1"]}', "'outputs' must be a non-empty list"),
    ('{"inputs": ["1"], "outputs": ["1", "2"]}', "1 inputs but 2 outputs"),
    ('{"inputs": [], "outputs": []}', "non-empty list"),
    ('{"inputs": [1], "outputs": ["1"]}', "list of strings"),
    ('{"asserts": ["assert f(1) =="]}', "asserts[0] is not valid Python"),
    ('{"asserts": ["assert 1"], "setup": 3}', '"setup" must be a string'),
    ('{"fn_name": "f"}', "either"),
])
def test_malformed_ground_truth_is_rejected(gt, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        check_ground_truth(gt)
    with pytest.raises(ValueError):
        code_reward("print(1)", gt)


def test_valid_ground_truths_pass_the_check():
    check_ground_truth(IO)
    check_ground_truth(ASSERTS)
    check_ground_truth(json.dumps({"inputs": ["1"], "outputs": ["1"], "fn_name": "ignored"}))


# --- adaptive timeout ----------------------------------------------------------------------------------


def correct(*runtimes: float) -> RewardResult:
    return RewardResult(score=1.0, correct=True, info={"runtimes": list(runtimes)})


def test_adaptive_timeout_matches_the_reference_examples():
    adaptive = AdaptiveTimeout(t_min=2.0, t_max=30.0, lam=1.5)
    assert adaptive.timeout_for("case") == 30.0  # no correct run seen yet: T_max
    for anchor, expected in [(4.0, 6.0), (1.0, 2.0), (25.0, 30.0)]:
        fresh = AdaptiveTimeout()
        fresh.observe("case", correct(anchor))
        assert fresh.timeout_for("case") == pytest.approx(expected)


def test_adaptive_timeout_anchor_is_the_longest_correct_run():
    adaptive = AdaptiveTimeout()
    adaptive.observe("a", correct(0.5, 3.0, 1.0))  # a response's runtime: its slowest test
    assert adaptive.timeout_for("a") == pytest.approx(4.5)
    adaptive.observe("a", correct(2.0))  # shorter: the anchor stays
    adaptive.observe("a", RewardResult(score=0.0, correct=False, info={"runtimes": [20.0]}))  # wrong: ignored
    adaptive.observe("a", RewardResult.failed("timeout", "reward timed out"))  # no info: ignored
    assert adaptive.timeout_for("a") == pytest.approx(4.5)
    adaptive.observe("a", correct(5.0))
    assert adaptive.timeout_for("a") == pytest.approx(7.5)
    assert adaptive.timeout_for("b") == 30.0  # per test case


def test_adaptive_timeout_checkpoint_round_trip():
    adaptive = AdaptiveTimeout(t_min=0.2, t_max=3.0, lam=2.0)
    adaptive.observe("x", correct(0.4))
    adaptive.observe("y", correct(0.01))
    restored = AdaptiveTimeout.from_dict(json.loads(json.dumps(adaptive.to_dict())))
    assert restored.to_dict() == adaptive.to_dict()
    assert [restored.timeout_for(k) for k in "xyz"] == pytest.approx([0.8, 0.2, 3.0])
    with pytest.raises(ValueError):
        AdaptiveTimeout(t_min=5.0, t_max=1.0)


def test_code_reward_uses_the_adaptive_state_and_feeds_it():
    adaptive = AdaptiveTimeout(t_min=0.5, t_max=3.0)
    first = code_reward(fenced("a, b = map(int, input().split())\nprint(a + b)"), IO, case_key="sum",
                        adaptive=adaptive.to_dict())
    assert first.info["timeout_s"] == 3.0 and first.info["case_key"] == "sum"
    adaptive.observe("sum", first)
    timeout = adaptive.timeout_for("sum")
    assert 0.5 <= timeout < 3.0
    loop = code_reward(fenced("while True:\n    pass"), IO, case_key="sum", adaptive=adaptive.to_dict())
    assert loop.info["timeout_s"] == timeout and loop.info["statuses"] == ["timeout"]
    assert loop.info["runtimes"][0] < timeout + 1.0
    capped = code_reward(fenced("print(3)"), IO, case_key="new", adaptive=adaptive.to_dict(), timeout_s=1.0)
    assert capped.info["timeout_s"] == 1.0


def test_builtins_the_program_rebinds_are_not_the_ones_the_parent_calls():
    gt = json.dumps({"asserts": ["assert abs(third(1) - 1 / 3) < 1e-9", "assert all([third(3) == 1])"]})
    assert code_reward(fenced("def third(x):\n    return x / 3"), gt, partial_credit=True, **FAST).score == 1.0
    cheat = "def abs(v):\n    return 0\ndef all(v):\n    return True\ndef third(x):\n    return 0"
    result = code_reward(fenced(cheat), gt, partial_credit=True, **FAST)
    assert result.score == 0.0 and "unsplit" not in result.info


def test_humaneval_form_with_metadata_and_constants_is_split():
    test = ("METADATA = {'author': 'x'}\n\n\ndef check(candidate):\n    '''Tests.'''\n    xs = [3, 1, 2]\n"
            "    expected = [1, 2, 3]\n    assert candidate(xs) == expected\n    assert candidate([]) == []\n\n"
            "check(sort_it)")
    gt = json.dumps({"asserts": [test]})
    good = code_reward(fenced("def sort_it(v):\n    return sorted(v)"), gt, **FAST)
    assert good.score == 1.0 and "unsplit" not in good.info, good.info
    # the expected list never enters the sandbox: reading the program's own source does not find it
    cheat = ("import sys\nconsts = sys._getframe(0).f_code.co_consts\n"
             "seen = repr([c.co_consts for c in consts if hasattr(c, 'co_consts')])\n"
             "def sort_it(v):\n    return [1, 2, 3] if '1, 2, 3' in seen else v")
    assert code_reward(fenced(cheat), gt, **FAST).score == 0.0


def test_setup_helpers_run_without_the_program():
    gt = json.dumps({"setup": "def approx(a, b):\n    return abs(a - b) < 1e-6",
                     "asserts": ["assert approx(half(3), 1.5)", "assert approx(half(1), 0.5) and half(0) == 0"]})
    assert code_reward(fenced("def half(x):\n    return x / 2"), gt, partial_credit=True, **FAST).score == 1.0
    cheat = "def approx(a, b):\n    return True\ndef half(x):\n    return 0"  # rebinds the helper
    assert code_reward(fenced(cheat), gt, partial_credit=True, **FAST).score == 0.0
    sneaky = "def half(x):\n    globals()['approx'] = lambda a, b: True\n    return 0"
    assert code_reward(fenced(sneaky), gt, partial_credit=True, **FAST).score == 0.0


@pytest.mark.parametrize("forged", [
    '[{"v": ["q", "0x1", "0x0"]}]',  # a fraction with a zero denominator
    '[{"v": ["D", "not a number"]}]',
    '[{"v": ["zz"]}]',
    '[' * 5000 + ']' * 5000,
], ids=["zero-denominator", "bad-decimal", "unknown-kind", "deep-nesting"])
def test_forged_results_fail_the_test_without_failing_the_reward(forged):
    gt = json.dumps({"asserts": ["assert f(1) == 1"]})
    cheat = f"import os\nos.write(4, {forged!r}.encode())\nos._exit(0)"
    result = code_reward(fenced(cheat), gt, **FAST)
    assert result.status == "ok" and result.score == 0.0


def test_values_too_large_to_compare_fail_instead_of_stalling_the_parent():
    gt = json.dumps({"asserts": ["assert 2 ** big(1) == 4", "assert 'x' * big(2) == 'xx'", "assert fact(3000) == 1"]})
    code = "import math\ndef big(x):\n    return 10 ** 9\ndef fact(n):\n    return math.factorial(n)"
    result = code_reward(fenced(code), gt, partial_credit=True, **FAST)
    assert result.status == "ok" and result.score == 0.0 and result.info["statuses"] == ["wrong"] * 3
