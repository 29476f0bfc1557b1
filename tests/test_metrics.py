"""Tests for vqa.evaluation.metrics' VQA accuracy: vqa_accuracy and normalize_answer worked by hand from the
official vqaEval.py rules, and vqa_scores. The caption scores and ptb_tokenize are in
test_metrics_captions.py."""

from types import SimpleNamespace

import pytest

from vqa.evaluation.metrics import (
    caption_scores,
    normalize_answer,
    process_punctuation,
    vqa_accuracy,
    vqa_scores,
)


def ten(answer, k, other="blue"):
    """Ten annotator answers, k of them `answer` and the rest `other`."""
    return [answer] * k + [other] * (10 - k)


# --- vqa_accuracy: the leave-one-out formula -----------------------------------------------------
def test_all_ten_agree_exact_match_is_one():
    assert vqa_accuracy("yes", ["yes"] * 10) == 1.0


@pytest.mark.parametrize(
    "k, expected",
    [
        (0, 0.0),
        # 1 annotator: 1 subset (it left out) has 0 matches, 9 have 1 -> 9 * (1/3) / 10
        (1, 0.3),
        # 2: 2 subsets have 1 match, 8 have 2 -> (2/3 + 16/3) / 10
        (2, 0.6),
        # 3: 3 subsets have 2 matches (2/3 each), 7 have 3 (1 each) -> (2 + 7) / 10
        (3, 0.9),
        (4, 1.0),  # 4 subsets have 3 matches, 6 have 4: all capped at 1
        (7, 1.0),
    ],
)
def test_leave_one_out_by_number_of_matching_annotators(k, expected):
    assert vqa_accuracy("red", ten("red", k)) == pytest.approx(expected)


def test_fewer_than_ten_answers_need_min_3_n_matches():
    # users' data: one answer is exact match (after normalization when answers disagree)
    assert vqa_accuracy("yes", ["yes"]) == 1.0
    assert vqa_accuracy("no", ["yes"]) == 0.0
    assert vqa_accuracy("yes", ["yes", "no"]) == pytest.approx(0.5)
    assert vqa_accuracy("yes", ["yes", "yes", "no"]) == pytest.approx(2 / 3)
    assert vqa_accuracy("yes", ["yes", "yes", "yes"]) == 1.0
    assert vqa_accuracy("two", ["2", "3"]) == pytest.approx(0.5)  # disagreeing answers are normalized
    assert vqa_accuracy("yes", ["yes"] * 9) == 1.0


def test_no_answers_is_an_error():
    with pytest.raises(ValueError):
        vqa_accuracy("yes", [])
    with pytest.raises(ValueError):
        vqa_accuracy("yes", "yes")  # a bare string is not a list of answers


# --- vqa_accuracy: when normalization happens (official code after its 2021 fix) ----------------
def test_number_words_not_normalized_when_annotators_agree():
    # All ten say "2": len(set(gts)) == 1, so neither side is processed and "two" != "2".
    assert vqa_accuracy("two", ["2"] * 10) == 0.0
    # Once annotators disagree, everything goes through processDigitArticle: "two" -> "2".
    assert vqa_accuracy("two", ten("2", 9, other="3")) == 1.0
    assert vqa_accuracy("Two", ten("2", 3, other="3")) == pytest.approx(0.9)


def test_case_and_punctuation_only_forgiven_when_annotators_disagree():
    assert vqa_accuracy("yes.", ["yes"] * 10) == 0.0
    assert vqa_accuracy("Yes", ["yes"] * 10) == 0.0
    assert vqa_accuracy("yes.", ten("yes", 4, other="no")) == 1.0
    assert vqa_accuracy("Yes", ten("yes", 4, other="no")) == 1.0


def test_ground_truth_is_normalized_too_when_annotators_disagree():
    # "2" x3 and "two" x2 both become "2": 5 matches -> 1.0 (without GT normalization: 3 -> 0.9).
    assert vqa_accuracy("2", ["2"] * 3 + ["two"] * 2 + ["3"] * 5) == 1.0
    # "a dog" and "the dog" become "dog": 4 matches for the prediction "dog".
    assert vqa_accuracy("dog", ["a dog", "the dog", "dog", "dog"] + ["cat"] * 6) == 1.0


def test_whitespace_is_always_stripped():
    assert vqa_accuracy("  yes  ", ["yes"] * 10) == 1.0
    assert vqa_accuracy("yes\n", ["yes"] * 10) == 1.0
    assert vqa_accuracy("\tyes", [" yes "] * 10) == 1.0
    assert vqa_accuracy("blue\tsky", ["blue sky"] * 10) == 1.0  # tab -> space


def test_articles_and_contractions_when_annotators_disagree():
    assert vqa_accuracy("a dog", ten("dog", 3, other="cat")) == pytest.approx(0.9)
    assert vqa_accuracy("dont", ten("don't", 4, other="no")) == 1.0
    assert vqa_accuracy("an apple", ten("apple", 1, other="pear")) == pytest.approx(0.3)


# --- normalize_answer: processPunctuation + processDigitArticle ----------------------------------
@pytest.mark.parametrize(
    "raw, expected",
    [
        ("yes.", "yes"),
        ("Yes!", "yes"),
        ("3.5", "3.5"),  # periodStrip keeps a period followed by a digit
        ("5.", "5"),
        ("1,000", "1000"),  # digit,digit comma anywhere: every punct char is deleted, not spaced
        ("red,white", "red white"),  # no digit comma and no space next to it: replaced by a space
        ("red, white", "red white"),  # touching a space: deleted
        ("black-and-white", "black and white"),
        ("t-shirt", "t shirt"),
        ("The Two dogs", "2 dogs"),
        ("none", "0"),
        ("ten", "10"),
        ("an apple", "apple"),
        ("dont", "don't"),
        ("Im", "im"),  # the official "Im" key is capitalized, so after lower() it never applies
        ("oclock", "o'clock"),
        ("it's", "it's"),  # apostrophe is not in the official punct list
        ("(yes)", "yes"),
        ("left/right", "left right"),
        ("e.g.", "eg"),
    ],
)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


def test_period_strip_count_quirk_is_reproduced():
    # vqaEval passes re.UNICODE (32) positionally to sub(), i.e. as count: at most 32 periods go.
    assert process_punctuation("." * 40) == "." * 8


# --- vqa_scores --------------------------------------------------------------------------------
def record(qid, answers, answer_type, question_type):
    return SimpleNamespace(question_id=qid, answers=answers, answer_type=answer_type, question_type=question_type)


def test_vqa_scores_overall_and_per_type():
    records = [
        record(1, ["yes"] * 10, "yes/no", "is the"),  # 1.0
        record(2, ten("2", 3, other="3"), "number", "how many"),  # "two" -> 0.9
        record(3, ten("red", 1), "other", "what color"),  # 0.3
        record(4, ["no"] * 10, "yes/no", "is the"),  # "yes" -> 0.0
    ]
    preds = {1: "yes", 2: "two", 3: "red", 4: "yes", 99: "ignored"}
    s = vqa_scores(preds, records)
    assert s["overall"] == round(100 * (1.0 + 0.9 + 0.3 + 0.0) / 4, 2) == 55.0
    assert s["per_answer_type"] == {"yes/no": 50.0, "number": 90.0, "other": 30.0}
    assert s["per_question_type"] == {"is the": 50.0, "how many": 90.0, "what color": 30.0}
    assert s["per_question"] == {1: 100.0, 2: 90.0, 3: 30.0, 4: 0.0}
    assert s["count"] == 4


def test_vqa_scores_rounds_to_two_decimals_and_accepts_vqa_style_answer_dicts():
    answers = [{"answer": a, "answer_id": i} for i, a in enumerate(ten("red", 1))]
    records = [record(1, answers, "other", "what"), record(2, ["a"] * 10, "other", "what"),
               record(3, ["b"] * 10, "other", "what")]
    s = vqa_scores({1: "red", 2: "a", 3: "x"}, records)
    assert s["overall"] == 43.33  # (0.3 + 1 + 0) / 3 = 43.333...


def test_vqa_scores_leaves_untyped_records_out_of_the_breakdowns():
    records = [record(1, ["yes"] * 10, "", None), record(2, ["no"] * 10, "yes/no", "")]
    s = vqa_scores({1: "yes", 2: "yes"}, records)
    assert s["overall"] == 50.0
    assert s["per_answer_type"] == {"yes/no": 0.0}
    assert s["per_question_type"] == {}


def test_vqa_scores_missing_prediction_names_the_question():
    with pytest.raises(ValueError, match="123"):
        vqa_scores({1: "yes"}, [record(1, ["yes"] * 10, "yes/no", "is"), record(123, ["no"] * 10, "yes/no", "is")])
    with pytest.raises(ValueError):
        vqa_scores({}, [])


# --- cases the mutation run (make mutation) showed unchecked -------------------------------------
def test_errors_say_what_is_missing():
    with pytest.raises(ValueError, match="^vqa_accuracy needs a non-empty list of ground-truth answers$"):
        vqa_accuracy("yes", [])
    with pytest.raises(ValueError, match="^vqa_scores needs at least one record$"):
        vqa_scores({}, [])
    with pytest.raises(ValueError, match=r"^no prediction for 6 question\(s\), e.g. question_id \[1, 2, 3, 4, 5\]$"):
        vqa_scores({}, [record(i, ["a"] * 10, "", "") for i in range(1, 7)])
    with pytest.raises(ValueError, match="^caption_scores needs at least one image$"):
        caption_scores({}, {})


def test_vqa_scores_reads_records_without_type_fields_and_rounds_per_question():
    bare = [SimpleNamespace(question_id=1, answers=["red", "blue", "green"])]  # no answer_type, question_type
    s = vqa_scores({1: "red"}, bare)
    assert s["per_answer_type"] == s["per_question_type"] == {}
    assert s["per_question"] == {1: 33.33} and s["overall"] == 33.33  # 1 match of min(3, 3)


def test_fewer_than_ten_answers_full_credit_at_three_matches():
    assert vqa_accuracy("yes", ["yes", "yes", "yes", "no"]) == 1.0  # min(1, 3 / min(3, 4))


def test_newlines_and_tabs_inside_answers_are_spaces():
    assert vqa_accuracy("two\ndogs", ["two dogs"] * 10) == 1.0
    assert vqa_accuracy("two\tdogs", ["two dogs"] * 10) == 1.0


@pytest.mark.parametrize("raw, expected", [
    ("well- done", "well done"),  # a PUNCT character touching a space on either side is deleted ...
    ("well -done", "well done"),
    ("well-done", "well done"),  # ... else it becomes a space
])
def test_process_punctuation_one_sided_spaces(raw, expected):
    assert process_punctuation(raw) == expected
