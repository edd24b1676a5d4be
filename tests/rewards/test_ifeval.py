import json

import pytest

from gyre.rewards.ifeval import check_ground_truth, ifeval_reward


def gt(*constraints):
    return json.dumps({"constraints": list(constraints)})


def ok(response, constraint):
    result = ifeval_reward(response, gt(constraint))
    assert result.score == float(result.correct)
    return result.correct


# (constraint, a response that satisfies it, one that violates it)
CASES = [
    ({"type": "word_count", "min": 3, "max": 5}, "one two three four", "one two"),
    ({"type": "word_count", "min": 3, "max": 5}, "don't state-of-the-art go", "a b c d e f"),
    ({"type": "word_count", "min": 2}, "a b c d e f g", "a"),
    ({"type": "word_count", "max": 2}, "", "a b c"),
    ({"type": "contains_keywords", "keywords": ["Cat", "blue sky"]}, "The cat saw a BLUE SKY.", "A category, blue sky"),
    ({"type": "contains_keywords", "keywords": ["C++"]}, "I like C++.", "I like C."),
    ({"type": "forbidden_words", "words": ["bad", "very good"]}, "badly done, good", "This is Bad."),
    ({"type": "forbidden_words", "words": ["very good"]}, "very, good", "It was Very Good"),
    ({"type": "no_commas"}, "no commas here.", "one, two"),
    ({"type": "lowercase"}, "all lower case 123!", "Not all lower"),
    ({"type": "lowercase"}, "ok", "123 !"),  # no letters at all is not "lower case"
    ({"type": "uppercase"}, "ALL CAPS 42!", "ALL CAPS but one"),
    ({"type": "starts_with", "phrase": "Dear Sir"}, "  \nDear Sir, hello", "Hello Dear Sir"),
    ({"type": "ends_with", "phrase": "Any questions?"}, "Text. Any questions?  \n\n", "Any questions? Yes."),
    ({"type": "ends_with", "phrase": "Any questions?"}, "x Any questions?", "x any questions?"),  # case matters
    ({"type": "bullet_points", "count": 3}, "Intro\n* a\n- b\n  * c\nEnd", "* a\n* b"),
    ({"type": "bullet_points", "count": 2}, "* a\n* b\n***\n*bold*\n-x", "* a\n* b\n- c"),
    ({"type": "json_format"}, '{"a": [1, 2]}', "{'a': 1}"),
    ({"type": "json_format"}, '```json\n{"a": 1}\n```\n', 'Here: {"a": 1}'),
    ({"type": "json_format"}, '```\n[1, 2]\n```', '```json\n{"a": 1}'),
    ({"type": "num_paragraphs", "count": 3}, "one\n\ntwo\n   \nthree", "one\ntwo\nthree"),
    ({"type": "num_paragraphs", "count": 3}, "one *** two\n***\nthree", "one\n\ntwo"),
    ({"type": "num_paragraphs", "count": 2}, "\n\none\n\n\n\ntwo\n\n", "***bold*** text"),
    ({"type": "quotation"}, '  "He said hi."\n', 'He said "hi."'),
    ({"type": "quotation"}, "“curly”", '"'),
    ({"type": "placeholder", "count": 2}, "Dear [name], at [address] and [x]", "Dear [name], see [docs](http://x)"),
    ({"type": "placeholder", "count": 1}, "[a]", "[] and [\n]"),
    ({"type": "sections", "marker": "SECTION", "count": 2}, "SECTION 1\nx\nSECTION 2\ny", "SECTION 1\nSECTION two"),
    ({"type": "sections", "marker": "Section", "count": 2}, "Section 1 a Section 2 b Section 3", "Sub-section 1"),
]


@pytest.mark.parametrize("constraint,good,bad", CASES)
def test_each_constraint(constraint, good, bad):
    assert ok(good, constraint), good
    assert not ok(bad, constraint), bad


def test_partial_credit_arithmetic():
    truth = gt({"type": "no_commas"}, {"type": "lowercase"}, {"type": "ends_with", "phrase": "bye"},
               {"type": "word_count", "max": 3})
    result = ifeval_reward("hello, bye", truth)
    assert result.info == {"satisfied": [False, True, True, True]}
    assert result.score == pytest.approx(0.75) and result.correct is False
    strict = ifeval_reward("hello, bye", truth, partial_credit=False)
    assert (strict.score, strict.correct) == (0.0, False)
    assert strict.info == {"satisfied": [False, True, True, True]}
    full = ifeval_reward("hello bye", truth, partial_credit=False)
    assert (full.score, full.correct) == (1.0, True)
    assert ifeval_reward("Hello, Bye Bye Bye", truth).score == 0.0


def test_one_third():
    truth = gt({"type": "no_commas"}, {"type": "uppercase"}, {"type": "quotation"})
    assert ifeval_reward("no commas", truth).score == pytest.approx(1 / 3)


@pytest.mark.parametrize("truth,message", [
    ("not json", "not JSON"),
    ("[]", "constraints"),
    ('{"constraints": []}', "at least one constraint"),
    ('{"rules": [{"type": "no_commas"}]}', "constraints"),
    (gt({"type": "shout"}), r"constraint 0 \(shout\): unknown type; known types: .*bullet_points.*word_count"),
    (gt({"type": "no_commas"}, {"min": 3}), r"constraint 1 .*unknown type"),
    (gt("no_commas"), r"constraint 0 .*unknown type"),
    (gt({"type": ["x"]}), r"unknown type"),
    (gt({"type": "bullet_points"}), r"constraint 0 \(bullet_points\): missing parameter\(s\) \['count'\]"),
    (gt({"type": "sections", "count": 2}), r"missing parameter\(s\) \['marker'\]"),
    (gt({"type": "word_count"}), r"missing parameter\(s\) \['min or max'\]"),
    (gt({"type": "word_count", "min": 5, "max": 2}), "exceeds max"),
    (gt({"type": "bullet_points", "cuont": 3}), r"unknown parameter\(s\) \['cuont'\]"),
    (gt({"type": "no_commas", "count": 1}), r"unknown parameter\(s\) \['count'\]; no_commas takes none"),
    (gt({"type": "bullet_points", "count": "3"}), "count must be a non-negative integer"),
    (gt({"type": "bullet_points", "count": -1}), "count must be a non-negative integer"),
    (gt({"type": "bullet_points", "count": True}), "count must be a non-negative integer"),
    (gt({"type": "ends_with", "phrase": "  "}), "phrase must be a non-empty string"),
    (gt({"type": "contains_keywords", "keywords": "cat"}), "keywords must be a non-empty list"),
    (gt({"type": "contains_keywords", "keywords": []}), "keywords must be a non-empty list"),
    (gt({"type": "forbidden_words", "words": ["ok", 3]}), "words must be a non-empty list"),
])
def test_malformed_ground_truth(truth, message):
    with pytest.raises(ValueError, match=message):
        check_ground_truth(truth)
    with pytest.raises(ValueError, match=message):
        ifeval_reward("anything", truth)


def test_valid_ground_truth_passes():
    check_ground_truth(gt(*(c for c, _, _ in CASES)))


def test_adversarial_responses():
    truth = gt({"type": "json_format"}, {"type": "bullet_points", "count": 1}, {"type": "word_count", "max": 10})
    assert ifeval_reward("", truth).info["satisfied"] == [False, False, True]
    huge = "word " * 200_000
    assert ifeval_reward(huge, truth).info["satisfied"] == [False, False, False]
    assert ifeval_reward("{" * 10_000, truth).score == pytest.approx(1 / 3)  # deep nesting is just not JSON
