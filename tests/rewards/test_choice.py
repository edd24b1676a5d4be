import json
import time

import pytest

from gyre.rewards.choice import check_ground_truth, choice_reward


@pytest.mark.parametrize("response,extracted,source", [
    ("\\boxed{B}", "B", "boxed"),
    ("so the answer is $\\boxed{\\text{B}}$", "B", "boxed"),
    ("\\boxed{(b)}", "B", "boxed"),
    ("\\boxed{\\textbf{B}.}", "B", "boxed"),
    ("\\boxed{A} hmm, no: \\boxed{B}", "B", "boxed"),
    ("Answer: C, final: \\boxed{B}", "B", "boxed"),  # a box outranks a phrase
    ("\\boxed{42}. The answer is (B)", "B", "answer phrase"),  # a box that is not a letter is passed over
    ("The answer is (B)", "B", "answer phrase"),
    ("Answer: B", "B", "answer phrase"),
    ("answer: (B).", "B", "answer phrase"),
    ("**Answer:** B", "B", "answer phrase"),
    ("**Answer**: **B**", "B", "answer phrase"),
    ("The correct answer is: B because it is", "B", "answer phrase"),
    ("The answer is option B", "B", "answer phrase"),
    ("ANSWER IS B", "B", "answer phrase"),
    ("The answer is $B$.", "B", "answer phrase"),
    ("Answer: A\nWait, that is wrong.\nAnswer: B", "B", "answer phrase"),
    ("Answer: B or B", "B", "answer phrase"),
    ("B", "B", "bare letter"),
    (" (b) ", "B", "bare letter"),
    ("B.", "B", "bare letter"),
    ("**B**\n", "B", "bare letter"),
])
def test_correct_answers(response, extracted, source):
    result = choice_reward(response, "B")
    assert (result.score, result.correct) == (1.0, True)
    assert result.info == {"extracted": extracted, "source": source}


@pytest.mark.parametrize("response,extracted", [
    ("\\boxed{C}", "C"),
    ("The answer is (A)", "A"),
    ("Answer: B\nOn reflection, Answer: D", "D"),  # the last explicit answer wins
    ("A", "A"),
    ("", None),
    ("I do not know", None),
    ("the answer is a number", None),  # a lower-case "a" after "answer is" is an article
    ("The answer is Because of B", None),
    ("The answer is E", None),  # not among the choices A-D
    ("\\boxed{E}", None),
    ("Answer choice B looks good", None),  # needs "is" or ":" after "answer"
])
def test_wrong_or_missing_answers(response, extracted):
    result = choice_reward(response, "B")
    assert (result.score, result.correct) == (0.0, False)
    assert result.info["extracted"] == extracted


@pytest.mark.parametrize("response,letters", [
    ("Answer: A or B", ["A", "B"]),
    ("The answer is (A), (B)", ["A", "B"]),
    ("answer: A/B", ["A", "B"]),
    ("Answer: A, B, C, D", ["A", "B", "C", "D"]),
    ("The answer is B and **C**", ["B", "C"]),
    ("\\boxed{A \\text{ or } B}", None),  # not a plain letter list: passed over, and nothing else answers
    ("\\boxed{B or C}", ["B", "C"]),
    ("Answer: B\nAnswer: A or B", ["A", "B"]),  # an ambiguous final answer does not fall back to "B"
])
def test_ambiguous_answers_score_zero(response, letters):
    result = choice_reward(response, "B")
    assert (result.score, result.correct) == (0.0, False)
    assert result.info["extracted"] is None
    assert result.info.get("ambiguous") == letters


@pytest.mark.parametrize("response", [
    "A B C D", "A or B", "(A) (B) (C) (D)", "A, B, C or D", "ABCD", "B B", "\\boxed{}", "\\boxed{B", "Answer:",
])
def test_listing_or_malformed_is_not_an_answer(response):
    assert choice_reward(response, "B").score == 0.0


def test_json_ground_truth_and_choices():
    truth = json.dumps({"answer": "F", "choices": list("ABCDEF")})
    assert choice_reward("Answer: F", truth).correct
    assert choice_reward("\\boxed{f}", truth).correct
    assert choice_reward("Answer: F", "F").correct  # default choices reach the answer's letter
    assert not choice_reward("Answer: F", json.dumps({"answer": "B"})).correct
    assert choice_reward("Answer: B", json.dumps({"answer": "b", "choices": ["a", "b"]})).correct
    # "I" is no option among A-D, so "I think" is not an answer; with choices up to J it would be.
    assert choice_reward("The answer is I think B", "B").info["extracted"] is None


@pytest.mark.parametrize("truth,message", [
    ("", "must be a letter"),
    ("BC", "must be a letter"),
    ("3", "must be a letter"),
    ("{not json", "not valid JSON"),
    ('{"choices": ["A"]}', "must be"),
    ('{"answer": "B", "extra": 1}', "must be"),
    ('["B"]', "must be"),
    ('{"answer": "BB"}', "answer must be one letter"),
    ('{"answer": 2}', "answer must be one letter"),
    ('{"answer": "B", "choices": "ABCD"}', "choices must be a list of single letters"),
    ('{"answer": "B", "choices": []}', "choices must be a list of single letters"),
    ('{"answer": "B", "choices": ["A", "1"]}', "choices must be a list of single letters"),
    ('{"answer": "E", "choices": ["A", "B"]}', "not among the choices"),
])
def test_malformed_ground_truth(truth, message):
    with pytest.raises(ValueError, match=message):
        check_ground_truth(truth)
    with pytest.raises(ValueError, match=message):
        choice_reward("B", truth)


def test_valid_ground_truths():
    for truth in ("B", " b ", '{"answer": "C"}', '{"answer": "C", "choices": ["A", "B", "C"]}'):
        check_ground_truth(truth)


def test_adversarial_inputs_are_fast():
    start = time.perf_counter()
    assert choice_reward("x " * 200_000 + "Answer: B", "B").correct
    assert choice_reward("answer is " + " " * 50_000 + "x", "B").score == 0.0
    assert choice_reward("answer is " + "*" * 50_000 + "x", "B").score == 0.0
    assert choice_reward("answer: " + "*" * 50_000 + "B", "B").correct
    assert choice_reward("\\boxed{" * 50_000, "B").score == 0.0
    assert choice_reward("answer: B" + " or B" * 20_000, "B").correct
    assert time.perf_counter() - start < 5
