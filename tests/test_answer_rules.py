"""Each benchmark's answers scored by its own evaluator (vqa.evaluation.answer_rules), checked against that
evaluator's logic written out again here, independently, on hand-made rows:

- TextVQA: MMF's TextVQAAccuracyEvaluator with EvalAI's answer processor (every answer and the prediction
  normalized, always);
- VizWiz: the VizWiz API's vqaEval.py (the prediction normalized, the ten answers compared as written);
- GQA: GQA's eval.py (the prediction equal to the one answer, nothing normalized);
- VQA v2 stays vqaEval.py's (tests/test_metrics.py): normalized only when the annotators disagree.

And that a split's questions get the rules of the format their file is in, which the printed table names."""

import json
import re

import pytest
from data_fixtures import write_image, write_jsonl

from vqa.data.readers.formats import FORMATS, load_split
from vqa.evaluation.answer_rules import (
    FORMAT_RULES,
    RULES,
    gqa_accuracy,
    rules_by_question,
    score_answers,
    textvqa_accuracy,
    vizwiz_accuracy,
)
from vqa.evaluation.evaluate import format_summary
from vqa.evaluation.metrics import ARTICLES, CONTRACTIONS, MANUAL_MAP, vqa_accuracy

# --- the official evaluators' logic, written out again -------------------------------------------------------
_PUNCT = ';/[]"{}()=+\\_->@<`,?!'  # vqaEval.py's punctuation list, as one string


def _punctuation(text: str) -> str:
    """vqaEval.py's processPunctuation: a mark next to a space (or anywhere, once the text holds a digit,digit
    comma) is deleted, otherwise it becomes a space; then at most 32 periods not followed by a digit go."""
    delete_all = re.search(r"\d,\d", text) is not None
    out = text
    for mark in _PUNCT:
        gone = delete_all or f"{mark} " in text or f" {mark}" in text
        out = out.replace(mark, "" if gone else " ")
    return re.sub(r"\.(?!\d)", "", out, count=32)


def _digits_articles(text: str) -> str:
    words = [MANUAL_MAP.get(w, w) for w in text.lower().split()]
    return " ".join(CONTRACTIONS.get(w, w) for w in words if w not in ARTICLES)


def _evalai(text: str) -> str:
    """EvalAIAnswerProcessor.__call__: word_tokenize (lower, drop ',' and '?', "'s" -> " 's", strip), newlines
    and tabs to spaces, strip, processPunctuation, processDigitArticle."""
    text = text.lower().replace(",", "").replace("?", "").replace("'s", " 's").strip()
    return _digits_articles(_punctuation(text.replace("\n", " ").replace("\t", " ").strip()))


def _leave_one_out(pred: str, gts: list[str]) -> float:
    """The mean, over each annotator left out, of min(1, the others matching / 3)."""
    accs = [min(1.0, sum(g == pred for j, g in enumerate(gts) if j != i) / 3) for i in range(len(gts))]
    return sum(accs) / len(accs)


def official_textvqa(pred: str, gts: list[str]) -> float:
    """TextVQAAccuracyEvaluator: each distinct processed answer's leave-one-out score; the processed
    prediction gets its answer's score, or 0."""
    processed = [_evalai(a) for a in gts]
    assert len(processed) == 10
    scores = {u: _leave_one_out(u, processed) for u in set(processed)}
    return scores.get(_evalai(pred), 0.0)


def official_vizwiz(pred: str, gts: list[str]) -> float:
    """VizWiz vqaEval.evaluate: the prediction cleaned and normalized; the answers as in the file."""
    p = _digits_articles(_punctuation(pred.replace("\n", " ").replace("\t", " ").strip()))
    return _leave_one_out(p, gts)


def official_gqa(pred: str, gold: str) -> float:
    return float(pred == gold)


ROWS_TEN = [  # (prediction, ten answers)
    ("beatles", ["the beatles"] * 10),
    ("nokia", ["Nokia"] * 10),
    ("stop", ["stop."] * 10),
    ("Nokia.", ["nokia"] * 10),
    ("the beatles", ["beatles"] * 10),
    ("Coca-Cola", ["coca cola"] * 10),
    ("1,000", ["1000"] * 10),
    ("two", ["2"] * 2 + ["3"] * 8),
    ("Two?", ["two"] * 3 + ["three"] * 7),
    ("john's", ["John's"] * 5 + ["johns"] * 5),
    ("dont", ["don't"] * 4 + ["no"] * 6),
    ("unanswerable", ["unanswerable"] * 7 + ["blue"] * 3),
    ("a red one", ["red"] * 4 + ["Red"] * 2 + ["dark red"] * 4),
    ("  yes\n", ["yes"] * 10),
    ("cat", ["dog"] * 10),
]


@pytest.mark.parametrize("pred, gts", ROWS_TEN)
def test_textvqa_and_vizwiz_score_as_their_evaluators(pred, gts):
    assert textvqa_accuracy(pred, gts) == pytest.approx(official_textvqa(pred, gts))
    assert vizwiz_accuracy(pred, gts) == pytest.approx(official_vizwiz(pred, gts))


def test_the_rows_that_tell_the_rules_apart():
    # all ten annotators agree: VQA v2 compares the raw strings, TextVQA normalizes every one
    for pred, gts in [("beatles", ["the beatles"] * 10), ("nokia", ["Nokia"] * 10), ("stop", ["stop."] * 10)]:
        assert vqa_accuracy(pred, gts) == 0.0
        assert textvqa_accuracy(pred, gts) == 1.0
    # VizWiz normalizes the prediction only
    assert vizwiz_accuracy("Nokia.", ["nokia"] * 10) == 1.0 and vqa_accuracy("Nokia.", ["nokia"] * 10) == 0.0
    assert vizwiz_accuracy("nokia", ["Nokia"] * 10) == 0.0
    assert textvqa_accuracy("two", ["2"] * 2 + ["3"] * 8) == pytest.approx(0.6)  # two annotators of ten


@pytest.mark.parametrize("pred, gold", [("no", "no"), ("No", "no"), ("no.", "no"), (" no", "no"), ("women", "woman"),
                                        ("traffic light", "traffic light"), ("2", "two")])
def test_gqa_is_exact_match(pred, gold):
    assert gqa_accuracy(pred, [gold]) == official_gqa(pred, gold)


def test_each_rule_wants_answers():
    for rule in RULES.values():
        with pytest.raises(ValueError, match="non-empty list of ground-truth answers"):
            rule.accuracy("yes", [])


# --- which rule a question gets -------------------------------------------------------------------------------
def test_format_rules_name_real_formats():
    assert set(FORMAT_RULES) <= {f.name for f in FORMATS} and set(FORMAT_RULES.values()) <= set(RULES)


def _benchmarks(root):
    """A TextVQA val file, and a JSONL val file beside it (the project's schema: VQA v2's rules)."""
    write_image(root / "train_images" / "t1.jpg")
    write_image(root / "a.png")
    data = [dict(question="what band?", image_id="t1", answers=["the beatles"] * 10, question_id=1)]
    (root / "TextVQA_0.5.1_val.json").write_text(json.dumps(dict(dataset_name="textvqa", data=data)))
    write_jsonl(root / "val.jsonl", [{"image": "a.png", "question": "what band?", "answers": ["the beatles"] * 10,
                                      "question_id": 2}])
    return load_split(root, "val", quiet=True)


def test_a_split_scores_each_question_by_its_files_format(tmp_path):
    split = _benchmarks(tmp_path)
    assert rules_by_question(split) == {1: "textvqa"}
    scores, label = score_answers({1: "beatles", 2: "beatles"}, list(split.vqa), split)
    assert scores["per_question"] == {1: 100.0, 2: 0.0}  # TextVQA's rules for 1, VQA v2's for 2
    assert label == f"{RULES['vqa_v2'].label} + {RULES['textvqa'].label}"
    forced, label = score_answers({1: "beatles", 2: "beatles"}, list(split.vqa), split, scoring="textvqa")
    assert forced["overall"] == 100.0 and label == RULES["textvqa"].label
    with pytest.raises(ValueError, match="unknown scoring rule 'okvqa'"):
        score_answers({1: "x"}, list(split.vqa), split, scoring="okvqa")


@pytest.mark.parametrize("kind", ["vizwiz", "gqa"])
def test_vizwiz_and_gqa_files_get_their_rules(tmp_path, kind):
    if kind == "vizwiz":
        write_image(tmp_path / "val" / "VizWiz_val_00000000.jpg")
        ans = [dict(answer="nokia", answer_confidence="yes")] * 10
        (tmp_path / "Annotations").mkdir()
        (tmp_path / "Annotations" / "val.json").write_text(json.dumps(
            [dict(image="VizWiz_val_00000000.jpg", question="brand?", answers=ans, answer_type="other")]))
        pred, want = "Nokia.", 100.0
    else:
        write_image(tmp_path / "images" / "n1.jpg")
        (tmp_path / "val_balanced_questions.json").write_text(json.dumps(
            {"7": dict(imageId="n1", question="is it?", answer="no", types=dict(structural="verify"))}))
        pred, want = "no ", 0.0  # a space too many: GQA's exact match (VQA v2's would strip it)
    split = load_split(tmp_path, "val", quiet=True)
    (qid,) = [r.question_id for r in split.vqa]
    scores, label = score_answers({qid: pred}, list(split.vqa), split)
    assert scores["overall"] == want and label == RULES[kind].label


def test_the_printed_table_names_the_rules_and_the_decoding():
    s = dict(images=1, seconds=0.1, questions=1, vqa_accuracy=100.0, per_answer_type={}, per_question_type={},
             scoring=RULES["textvqa"].label, decoding={"vqa": "beam search (3 beams, length penalty 0)"})
    text = format_summary(s)
    assert "VQA accuracy (1 questions, scored by TextVQA (every answer normalized)):" in text
    assert "decoding: answers beam search (3 beams, length penalty 0)" in text
