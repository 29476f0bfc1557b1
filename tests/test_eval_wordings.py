"""`vqa eval`'s accuracy per template: every question of every built-in set is matched back to exactly one of
its family's templates (the generator's own template always fits, so a single fit is the right one), and a
model that fails one wording shows it as a line of the table."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import pytest

from vqa.data.readers.formats import load_split
from vqa.data.synthetic import generator
from vqa.data.synthetic.corpus import CORPUS_SET
from vqa.data.synthetic.glyphs import GLYPHS_SET
from vqa.data.synthetic.scenes import SCENES_SET, generate_scenes
from vqa.data.synthetic.shapes import SHAPES_SET
from vqa.data.synthetic.templates import SETS, find_templates
from vqa.evaluation.evaluate import format_summary
from vqa.evaluation.metrics import vqa_scores
from vqa.evaluation.wordings import template_scores


@pytest.mark.parametrize("spec", [SHAPES_SET, SCENES_SET, GLYPHS_SET, CORPUS_SET], ids=lambda s: s.name)
def test_every_question_has_one_template_and_every_template_is_asked(spec):
    data = generator.build_split(spec, "train", 100, 64, 2, per_family=3)
    keys = [(q["family"], q["question"]) for q in data["questions"]]
    for wordings in SETS:  # no question fits two templates of its family, in any set's tables
        assert not [k for k in set(keys) if len(wordings.matches(*k)) > 1], wordings.name
    wordings, templates = find_templates(keys)
    assert wordings.name == spec.name
    used = Counter(zip((f for f, _ in keys), templates, strict=True))
    assert sorted(used) == sorted((f, t) for f, ts in wordings.templates.items() for t in ts)


@pytest.fixture(scope="module")
def scenes_val(tmp_path_factory):
    """A tiny Scenes set as written to disk, its val split read back as `vqa eval` reads it."""
    out = tmp_path_factory.mktemp("scenes")
    generate_scenes(out, n_train=2, n_val=30, seed=4, progress=False, workers=1, questions_per_family=3)
    return load_split(out, "val").vqa


def _summary(records, predictions) -> dict:
    scores = vqa_scores(predictions, records)
    return dict(images=30, seconds=1.0, questions=scores["count"], vqa_accuracy=scores["overall"],
                per_answer_type=scores["per_answer_type"], per_question_type=scores["per_question_type"],
                per_template=template_scores(records, scores["per_question"]))


def test_a_wording_the_model_fails_is_a_line_of_the_table(scenes_val):
    """Hand-made answers: right everywhere but on the spatial questions that name the reference object first."""
    records = [SimpleNamespace(question_id=r.question_id, question=r.question, answers=list(r.answers),
                               answer_type=r.answer_type, question_type=r.question_type) for r in scenes_val]
    flip = {"yes": "no", "no": "yes"}
    predictions = {r.question_id: flip[r.answers[0]] if r.question.startswith("compared with") else r.answers[0]
                   for r in records}
    s = _summary(records, predictions)
    t = s["per_template"]
    assert t["set"] == "Scenes"
    assert sum(row["questions"] for rows in t["per_family"].values() for row in rows.values()) == len(records)
    spatial = t["per_family"]["spatial"]
    first = {k: v for k, v in spatial.items() if k.startswith("compared with")}
    assert first and all(v["accuracy"] == 0.0 for v in first.values())
    assert all(v["accuracy"] == 100.0 for k, v in spatial.items() if k not in first)
    assert len(spatial) > len(first) and t["per_family"]["count"]
    printed = format_summary(s)
    assert "  per template (Scenes wordings; accuracy, questions):\n    attribute_color\n" in printed
    line = next(x for x in printed.splitlines() if "compared with the {b}, is the {a} " in x)
    assert line.split()[-2:] == ["0.00", str(next(iter(first.values()))["questions"])]
    json.dumps(s)  # summary.json holds it as it is


def test_questions_of_ones_own_have_no_templates(scenes_val):
    records = list(scenes_val)
    records[3] = SimpleNamespace(**{**vars(records[3]), "question": "what is the man holding?"})
    scores = vqa_scores({r.question_id: "no" for r in records}, records)
    assert template_scores(records, scores["per_question"]) is None
    assert find_templates([]) is None
    assert "per template" not in format_summary(dict(images=1, seconds=1.0, questions=1, vqa_accuracy=0.0,
                                                     per_answer_type={}, per_question_type={"count": 0.0}))
