"""`vqa eval --consistency`: the counterfactual twins the generator draws, the pair scores computed by hand, and
the command's files."""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_set_flags
from PIL import Image

from vqa.cli import main
from vqa.data.synthetic.scene_objects import SETS, SceneFile, load_scenes
from vqa.data.synthetic.shapes import SHAPES_SET
from vqa.data.synthetic.shapes_layout import COLORS
from vqa.errors import DataError
from vqa.evaluation.consistency import Consistency, Pair, make_pair, score_pairs

SIDE = 64


def _obj(shape, color, x, y, size="small"):
    d = 16 if size == "large" else 9
    return dict(shape=shape, color=color, size=size, x=x, y=y, d=d, box=[x - d / 2, y - d / 2, x + d / 2, y + d / 2])


def _file(tmp_path, *objs) -> SceneFile:
    """A Shapes scenes file of one scene (image 7), its picture drawn by the generator."""
    scene = dict(image_id=7, file_name="p.png", background="gray", style="noise", texture_seed=3, objects=list(objs))
    sf = SceneFile(SETS[0], tmp_path / "shapes_val_scenes.json", SIDE, {7: scene})
    sf.draw(scene).save(tmp_path / "p.png")
    return sf


def _meta(tmp_path, family, question, answer, qid=700):
    return dict(image_id=7, question_id=qid, question=question, answers=[answer] * 10, question_type=family,
                image=str(tmp_path / "p.png"))


def _centre(img: Image.Image, colour: str) -> tuple[float, float]:
    """The mean (x, y) of the centres of the pixels within 30 of `colour` (pixel i covers [i, i + 1))."""
    a = np.asarray(img).astype(int)
    ys, xs = np.nonzero(np.abs(a - np.array(COLORS[colour])).max(-1) < 30)
    return xs.mean() + 0.5, ys.mean() + 0.5


def test_a_mirror_swaps_left_and_right(tmp_path):
    sf = _file(tmp_path, _obj("circle", "red", 12, 30), _obj("square", "blue", 50, 34))
    pair = make_pair(sf, _meta(tmp_path, "spatial", "is the red circle left of the blue square?", "yes"))
    assert (pair.family, pair.answer, pair.changed, pair.scene) == ("mirror", "yes", "no", None)
    twin = Consistency(None, sf).picture(pair)
    assert np.array_equal(np.asarray(twin), np.asarray(Image.open(tmp_path / "p.png"))[:, ::-1])
    assert _centre(twin, "red")[0] == pytest.approx(SIDE - 12, abs=0.5)  # the circle now on the right ...
    assert _centre(twin, "red")[0] > _centre(twin, "blue")[0]  # ... of the square: "left of" is false
    no = make_pair(sf, _meta(tmp_path, "spatial", "is the blue square left of the red circle?", "no"))
    assert no.changed == "yes"
    assert make_pair(sf, _meta(tmp_path, "spatial", "is the red circle above the blue square?", "yes")) is None


def test_a_recolour_changes_the_named_object_alone(tmp_path):
    sf = _file(tmp_path, _obj("square", "red", 44, 44, "large"), _obj("circle", "red", 14, 14))
    q = "what color is the circle?"
    pair = make_pair(sf, _meta(tmp_path, "attribute_color", q, "red"))
    new = pair.changed
    assert pair.family == "recolour" and new != "red" and new in COLORS
    assert [o["color"] for o in pair.scene["objects"]] == ["red", new]  # the circle, not the first red object
    assert (q, new) in SHAPES_SET.candidates(pair.scene, SIDE, np.random.default_rng(0))["attribute_color"]
    twin = Consistency(None, sf).picture(pair)
    assert _centre(twin, new) == pytest.approx((14, 14), abs=1)  # drawn where the circle is
    assert _centre(twin, "red") == pytest.approx((44, 44), abs=1)
    again = make_pair(sf, _meta(tmp_path, "attribute_color", q, "red"))
    assert again.changed == new  # the same colour every run
    assert make_pair(sf, _meta(tmp_path, "attribute_color", q, "red", qid=701)).changed != new  # others elsewhere


def test_a_removal_drops_the_count_by_one(tmp_path):
    sf = _file(tmp_path, _obj("circle", "red", 12, 12), _obj("square", "blue", 50, 12), _obj("square", "red", 12, 50),
               _obj("diamond", "red", 50, 50))
    q = "how many red objects are there?"
    pair = make_pair(sf, _meta(tmp_path, "count", q, "3"))
    assert (pair.family, pair.changed) == ("remove", "2")
    kept = pair.scene["objects"]
    assert [o["shape"] for o in kept] == ["circle", "square", "square"]  # the last red one, the diamond, is gone
    assert (q, "2") in SHAPES_SET.candidates(pair.scene, SIDE, np.random.default_rng(0))["count"]
    twin = np.asarray(Consistency(None, sf).picture(pair)).astype(int)
    assert np.abs(twin[50, 50] - np.array(COLORS["red"])).max() > 60  # background where the diamond was
    with pytest.raises(DataError, match="has 3 objects that 'how many red objects are there\\?' counts"):
        make_pair(sf, _meta(tmp_path, "count", q, "2"))  # a miscounted answer: the file is not the questions'
    assert make_pair(sf, _meta(tmp_path, "count", "how many green objects are there?", "0")) is None


def _pair(family, answer, changed, qid):
    return Pair(family, qid, "q?", 1, "p.png", answer, changed, None)


def test_pair_scores_by_hand():
    pairs = [_pair("mirror", "yes", "no", 1), _pair("mirror", "yes", "no", 2), _pair("mirror", "no", "yes", 3),
             _pair("remove", "3", "2", 4), _pair("remove", "1", "0", 5), _pair("recolour", "red", "blue", 6)]
    original = {1: "yes", 2: "yes", 3: "yes", 4: "three", 5: "1", 6: "red"}
    twin = {1: "no", 2: "yes", 3: "yes", 4: "2", 5: "1", 6: "red"}
    s = score_pairs(pairs, original, twin)
    # mirror: 1 both right, 2 the twin wrong (the same answer), 3 the original wrong
    assert s["mirror"] == dict(pairs=3, consistent=33.33, original_accuracy=66.67, twin_accuracy=66.67,
                               consistent_given_original_right=50.0)
    # remove: "three" is 3 (the VQA normalization), 2 = 3 - 1; 5 kept its count
    assert s["remove"] == dict(pairs=2, consistent=50.0, original_accuracy=100.0, twin_accuracy=50.0,
                               consistent_given_original_right=50.0)
    assert s["recolour"]["consistent"] == 0.0 and s["recolour"]["twin_accuracy"] == 0.0
    assert s["all"]["pairs"] == 6 and s["all"]["consistent"] == pytest.approx(100 * 2 / 6, abs=0.01)


def test_no_pairs_score_nothing():
    s = score_pairs([], {}, {})
    assert s["mirror"] == dict(pairs=0, consistent=None, original_accuracy=None, twin_accuracy=None,
                               consistent_given_original_right=None)


@pytest.mark.parametrize("which", ["shapes", "scenes"])
def test_the_generator_draws_every_val_picture_again(which, shapes_dir, scenes_dir):
    """A twin differs from its original by the edit alone: the scenes file keeps what the drawing needs."""
    root = shapes_dir if which == "shapes" else scenes_dir
    sf = load_scenes(root, "val", "--consistency")
    assert sf.set.spec.prefix == which
    for scene in sf.scenes.values():
        assert np.array_equal(np.asarray(sf.draw(scene)), np.asarray(Image.open(root / "val" / scene["file_name"])))


def test_every_scenes_count_question_has_its_twin(scenes_dir):
    """Scenes words its count questions three ways: each is found, and the twin's count is one less."""
    sf = load_scenes(scenes_dir, "val", "--consistency")
    questions = json.loads((scenes_dir / "v2_OpenEnded_mscoco_val_questions.json").read_text())["questions"]
    qs = {q["question_id"]: q for q in questions}
    made = 0
    for a in json.loads((scenes_dir / "v2_mscoco_val_annotations.json").read_text())["annotations"]:
        meta = dict(image_id=a["image_id"], question_id=a["question_id"], question=qs[a["question_id"]]["question"],
                    answers=[x["answer"] for x in a["answers"]], question_type=a["question_type"], image="x.png")
        pair = make_pair(sf, meta)
        if a["question_type"] == "count" and a["multiple_choice_answer"] != "0":
            assert pair.family == "remove" and int(pair.changed) == int(a["multiple_choice_answer"]) - 1
            assert len(pair.scene["objects"]) == len(sf.scenes[a["image_id"]]["objects"]) - 1
            made += 1
    assert made >= 3


def test_vqa_eval_consistency_writes_its_scores(shapes_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--data", str(shapes_dir), "--out", str(run), "--batch-size", "4", "--eval-images", "0",
                 "--max-steps", "1", *tiny_set_flags()]) == 0
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(run), "--data", str(shapes_dir), "--consistency", "--tasks", "vqa"]) == 0
    printed = capsys.readouterr().out
    c = json.loads((run / "best-eval-val" / "consistency.json").read_text())
    sf = load_scenes(shapes_dir, "val", "--consistency")
    anns = json.loads((shapes_dir / "v2_mscoco_val_annotations.json").read_text())["annotations"]
    questions = {q["question_id"]: q["question"] for q in
                 json.loads((shapes_dir / "v2_OpenEnded_mscoco_val_questions.json").read_text())["questions"]}
    expected = sum(make_pair(sf, dict(image_id=a["image_id"], question_id=a["question_id"], image="x.png",
                                      question=questions[a["question_id"]], answers=[a["multiple_choice_answer"]],
                                      question_type=a["question_type"])) is not None for a in anns)
    assert c["families"]["all"]["pairs"] == expected > 0 and c["definition"] == "both answers right"
    assert "consistency (% of pairs with both answers right" in printed
    assert main(["eval", "--checkpoint", str(run), "--data", str(shapes_dir), "--consistency",
                 "--tasks", "caption"]) == 2
    assert "--consistency asks questions: it needs the vqa task" in capsys.readouterr().err


def test_consistency_needs_texture_seeds(shapes_dir, tmp_path):
    doc = json.loads((shapes_dir / "shapes_val_scenes.json").read_text())
    for s in doc["scenes"]:
        del s["texture_seed"]
    Path(tmp_path / "shapes_val_scenes.json").write_text(json.dumps(doc))
    with pytest.raises(DataError, match="no 'texture_seed', which --consistency needs"):
        Consistency(None, load_scenes(tmp_path, "val", "--consistency"))
