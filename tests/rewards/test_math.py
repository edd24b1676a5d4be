import pytest

from gyre.data.answers import last_boxed
from gyre.rewards.math import math_reward


@pytest.mark.parametrize("response,truth,ok", [
    ("85", "85", True),
    ("86", "85", False),
    ("-4", "-4", True),
    ("The answer is \\boxed{\\frac{1}{2}}", "0.5", True),
    ("1/2", "\\frac12", True),
    ("\\boxed{3}", "3", True),
    ("3.0", "3", True),
    ("$\\frac{2}{4}$", "\\frac{1}{2}", True),
    ("so x = 7", "7", True),
    ("", "7", False),
    ("no number here", "7", False),
    ("\\boxed{\\sqrt{2}}", "\\sqrt{2}", True),
    ("\\boxed{2}", "\\sqrt{2}", False),
])
def test_math_reward(response, truth, ok):
    result = math_reward(response, truth)
    assert result.correct is ok
    assert result.score == (1.0 if ok else 0.0)


def test_unparseable_ground_truth_is_an_error():
    with pytest.raises(ValueError, match="cannot be parsed"):
        math_reward("1", "  ")


# --- answer extraction -------------------------------------------------------------------------------

@pytest.mark.parametrize("text,content", [
    ("\\boxed{3}", "3"),
    ("x \\boxed{\\frac{1}{2}} y", "\\frac{1}{2}"),
    ("\\boxed{1} then \\boxed{2}", "2"),
    ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),  # escaped braces do not count
    ("\\boxed {4}", "4"),
    ("\\boxed{\\boxed{5}}", "\\boxed{5}"),  # the last box to close is the outer one
    ("} stray \\boxed{6}}", "6"),
    ("\\boxed{3} and \\boxed{4", "3"),  # an unclosed box is not an answer
    ("\\boxed{\\frac{1}{2}", None),
    ("no box", None),
    ("\\boxed{}", ""),
])
def test_last_boxed(text, content):
    assert last_boxed(text) == content


@pytest.mark.parametrize("response,truth,ok,extracted", [
    ("So $x = \\boxed{\\frac{1}{2}}$.", "0.5", True, "\\frac{1}{2}"),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", True, "\\frac{\\sqrt{3}}{2}"),
    ("First \\boxed{2}, no wait: \\boxed{3}", "3", True, "3"),
    ("First \\boxed{3}, no wait: \\boxed{2}", "3", False, "2"),
    ("The reasoning mentions 7 but \\boxed{8}", "7", False, "8"),
    ("\\boxed{(1, 2)}", "(1,2)", True, "(1, 2)"),
    ("\\boxed{}", "3", False, ""),
    ("\\boxed{0.5}", "\\frac{1}{2}", True, "0.5"),
    ("\\boxed{\\frac{1}{2}", "0.5", False, None),  # truncated box: no answer, not a search of the text
])
def test_boxed_auto(response, truth, ok, extracted):
    result = math_reward(response, truth)
    assert result.correct is ok
    assert result.score == float(ok)
    assert result.info["extracted"] == extracted


def test_whole_response_reports_what_math_verify_chose():
    assert math_reward("so x = 7", "7").info["extracted"] == "7"
    assert math_reward("85", "85").info["extracted"] == "85"
    assert math_reward("nothing", "\\frac12").info["extracted"] is None


def test_boxed_never_reads_the_whole_response():
    # math-verify itself prefers the box; "never" only means gyre does not cut the text first.
    assert math_reward("\\boxed{3}", "3", boxed="never").correct
    assert math_reward("so x = 7", "7", boxed="never").correct


def test_boxed_always_needs_a_box():
    result = math_reward("so x = 7", "7", boxed="always")
    assert (result.score, result.correct, result.info) == (0.0, False, {"extracted": None})
    assert math_reward("so \\boxed{7}", "7", boxed="always").correct


def test_bad_boxed_mode():
    with pytest.raises(ValueError, match="boxed must be one of"):
        math_reward("7", "7", boxed="sometimes")


@pytest.mark.parametrize("response,ok,extracted", [
    ("Work... Answer: 1/2", True, "1/2"),
    ("Answer: 3\nmore thoughts\nAnswer: \\frac{2}{4}", True, "\\frac{2}{4}"),  # the last match
    ("Answer: 0.5\nAnswer: 0.25", False, "0.25"),
    ("\\boxed{0.5} but no answer line", False, None),  # the pattern overrides box extraction
    ("Answer:", False, None),
])
def test_answer_pattern(response, ok, extracted):
    result = math_reward(response, "0.5", answer_pattern=r"Answer:[ \t]*(.+)")
    assert result.correct is ok
    assert result.info["extracted"] == extracted


def test_answer_pattern_integer_fast_path():
    result = math_reward("#### 42", "42", answer_pattern=r"####\s*(\S+)")
    assert result.correct and result.info["extracted"] == "42"


@pytest.mark.parametrize("pattern", [r"Answer: .+", r"(a)(b)"])
def test_answer_pattern_needs_one_group(pattern):
    with pytest.raises(ValueError, match="exactly one capturing group"):
        math_reward("Answer: 1", "1", answer_pattern=pattern)


@pytest.mark.parametrize("response,truth", [
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("\\boxed{0.5}", "\\frac{1}{2}"),
    ("\\boxed{\\dfrac{1}{2}}", "1/2"),
    ("\\boxed{50\\%}", "0.5"),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
])
def test_latex_and_plain_are_equivalent(response, truth):
    assert math_reward(response, truth).correct


@pytest.mark.parametrize("response", ["", "   ", "\\boxed", "}{", "\\boxed{{{", "$$", "\\frac{", "Answer"])
def test_malformed_responses_score_zero(response):
    result = math_reward(response, "\\frac{1}{2}")
    assert result.score == 0.0 and result.correct is False


def test_huge_response_with_a_box_is_cheap():
    response = "blah 1 2 3 { } " * 200_000 + "\\boxed{\\frac{1}{2}}"
    result = math_reward(response, "0.5")
    assert result.correct and result.info["extracted"] == "\\frac{1}{2}"


def test_huge_response_without_a_box():
    assert math_reward("word " * 20_000 + "7", "7").correct
    assert not math_reward("word " * 20_000, "\\frac{1}{2}").correct


def test_many_unclosed_boxes_are_linear():
    response = "\\boxed{" * 100_000 + "1"
    assert last_boxed(response) is None
    assert math_reward(response, "1").score == 0.0


def test_huge_box_content_is_truncated_in_info():
    result = math_reward("\\boxed{" + "1" * 2000 + "}", "1")
    assert result.correct is False and len(result.info["extracted"]) == 500
