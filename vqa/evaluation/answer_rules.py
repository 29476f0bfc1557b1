"""Each VQA benchmark's answers scored by its own evaluator's rules (`RULES`), chosen by the format of the file a
question came from (`rules_by_question`) or by `vqa eval --scoring`.

vqa_v2   VQA v2, OK-VQA, the project's JSONL and shards: `metrics.vqa_accuracy`, GT-Vision-Lab's vqaEval.py.
         The answers and the prediction are normalized only when the ground-truth answers disagree.
textvqa  MMF's `TextVQAAccuracyEvaluator` (the TextVQA challenge's, EvalAI's answer processor): every answer and
         the prediction are normalized, always: lower-cased, "," and "?" deleted, "'s" -> " 's", then
         vqaEval.py's processPunctuation and processDigitArticle (its digit-comma test never fires: the
         commas are gone). Then the leave-one-annotator-out formula over the ten answers.
vizwiz   The VizWiz API's vqaEval.py: the prediction is normalized (newlines and tabs to spaces, stripped,
         processPunctuation, processDigitArticle), always; the answers are compared as the file writes them.
         Its copies of the contraction table write most expansions with a curly or back-quote apostrophe
         ("dont" -> "don’t"); here VQA v2's table ("don't") is used, which differs only for such words.
gqa      GQA's eval.py: 1 when the prediction is exactly the question's one answer, else 0; nothing normalized.

The consensus formulas assume ten answers; with fewer, every rule here uses `metrics.vqa_accuracy`'s
min(1, matches / min(3, n)) on its own normalized strings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .metrics import _clean, check_answers, consensus, normalize_answer, vqa_accuracy, vqa_scores


def evalai_normalize(text: str) -> str:
    """EvalAI's answer processor as MMF's TextVQA accuracy runs it on every answer and on the prediction."""
    text = text.lower().replace(",", "").replace("?", "").replace("'s", " 's").strip()
    return normalize_answer(_clean(text))


def textvqa_accuracy(prediction: str, answers: list[str]) -> float:
    """TextVQA accuracy (0..1): every answer and the prediction through `evalai_normalize`, then the consensus."""
    check_answers(answers, "textvqa_accuracy")
    return consensus(evalai_normalize(prediction), [evalai_normalize(a) for a in answers])


def vizwiz_accuracy(prediction: str, answers: list[str]) -> float:
    """VizWiz accuracy (0..1): the prediction normalized as vqaEval.py does, the answers as written."""
    check_answers(answers, "vizwiz_accuracy")
    return consensus(normalize_answer(_clean(prediction)), list(answers))


def gqa_accuracy(prediction: str, answers: list[str]) -> float:
    """GQA accuracy: 1.0 when the prediction is exactly an answer (GQA gives one), else 0.0."""
    check_answers(answers, "gqa_accuracy")
    return float(prediction in answers)


@dataclass(frozen=True)
class AnswerRule:
    label: str  # the benchmark and its rule in a few words, for the results table
    accuracy: Callable[[str, list[str]], float]


RULES: dict[str, AnswerRule] = {
    "vqa_v2": AnswerRule("VQA v2 (answers normalized when the annotators disagree)", vqa_accuracy),
    "textvqa": AnswerRule("TextVQA (every answer normalized)", textvqa_accuracy),
    "vizwiz": AnswerRule("VizWiz (the prediction normalized, the answers as written)", vizwiz_accuracy),
    "gqa": AnswerRule("GQA (exact match)", gqa_accuracy),
}
DEFAULT_RULE = "vqa_v2"
FORMAT_RULES = {"textvqa": "textvqa", "vizwiz": "vizwiz", "gqa": "gqa"}  # `readers.formats.FORMATS` names


def rules_by_question(split) -> dict:
    """{question_id: rule name} for a folder split's questions whose file format has a rule of its own (the
    others, and a shard split's, are VQA v2's)."""
    out, start = {}, 0
    ids = split.vqa.question_id if getattr(split, "vqa_formats", None) else None
    for fmt, end in getattr(split, "vqa_formats", ()):
        rule = FORMAT_RULES.get(fmt)
        if rule is not None and end > start:
            chunk = ids[start:end]
            out.update(dict.fromkeys(chunk.tolist() if hasattr(chunk, "tolist") else chunk, rule))
        start = end
    return out


def score_answers(predictions: Mapping, records, split=None, scoring: str | None = None) -> tuple[dict, str]:
    """`metrics.vqa_scores` with every question scored by its benchmark's rule: `scoring` (a RULES name) for all,
    else the rule of the file it came from (`rules_by_question(split)`). Returns the scores and the rules used
    in words ("TextVQA (every answer normalized)"; mixed formats: the labels joined by " + ")."""
    records = list(records)
    if scoring is not None:
        if scoring not in RULES:
            raise ValueError(f"unknown scoring rule {scoring!r}; choose one of: {', '.join(RULES)}")
        names = {r.question_id: scoring for r in records}
    else:
        by_question = rules_by_question(split) if split is not None else {}
        names = {r.question_id: by_question.get(r.question_id, DEFAULT_RULE) for r in records}
    scores = vqa_scores(predictions, records, accuracy={q: RULES[n].accuracy for q, n in names.items()})
    used = set(names.values())
    return scores, " + ".join(rule.label for name, rule in RULES.items() if name in used)


__all__ = ["RULES", "DEFAULT_RULE", "FORMAT_RULES", "AnswerRule", "evalai_normalize", "textvqa_accuracy",
           "vizwiz_accuracy", "gqa_accuracy", "rules_by_question", "score_answers"]
