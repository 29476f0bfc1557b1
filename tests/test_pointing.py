"""`Predictor.point`, `vqa ask --point` and `vqa eval --pointing`: the peak of the attention behind the colour
probe, read back into the user's picture through the letterbox and never on its padding; not found when the
mean probability of "yes" over the two existence wordings is below one half; the evaluation's counts by hand and
its files."""

import json

import numpy as np
import pytest
from conftest import tiny_set_flags
from PIL import Image

from vqa.cli import main
from vqa.data.synthetic.scene_objects import load_scenes
from vqa.errors import InputError
from vqa.evaluation.pointing import EXISTS_QS, Pointing, absent_object, named_objects, peak_patch, there
from vqa.inference.pointing import object_words, on_picture
from vqa.inference.predict import Predictor
from vqa.weights import shipped


@pytest.fixture(scope="module")
def predictor():
    model, tok, card = shipped.load("tiny")
    return Predictor(model, tok, card, device="cpu")


def answering(predictor, monkeypatch, exists, peak: tuple[int, int]):
    """The predictor, "is there ...?" and "can you see ...?" answered `exists` (an answer, or one (answer,
    probability) per wording) and the colour probe's attention all on patch `peak`."""
    real = predictor.answer_batch
    seen = {}
    said = [(exists, 1.0)] * 2 if isinstance(exists, str) else exists

    def fake(images, questions, **kwargs):
        out = real(images, questions, **kwargs)
        seen["questions"] = list(questions)
        for a in out:
            asked = [i for i, q in enumerate(EXISTS_QS) if a.question.startswith(q.split("{")[0])]
            if asked:
                a.answer, p = said[asked[0]]
                a.top_k = [(a.answer, p)]
            else:
                a.attention = a.attention * 0
                a.attention[..., peak[0], peak[1]] = 1.0
        return out

    monkeypatch.setattr(predictor, "answer_batch", fake)
    return predictor, seen


def test_the_object_as_a_user_writes_it():
    assert object_words("the red star") == object_words("a red star?") == object_words("red star") == "red star"
    with pytest.raises(InputError, match="name the object"):
        object_words("  ")


def test_the_peak_comes_back_in_the_pictures_pixels(predictor, monkeypatch):
    # 120 x 80 letterboxed into 64 x 64: scale 64 / 120, the picture in rows 10..53 (43 px) of the square;
    # patch (row 4, column 2) of the 8 x 8 grid covers 16..24 x 32..40 px of the square
    pred, seen = answering(predictor, monkeypatch, "yes", (4, 2))
    p = pred.point(Image.new("RGB", (120, 80)), "the red star")
    assert seen["questions"] == ["is there a red star?", "can you see a red star?", "what color is the red star?"]
    assert p.found and p.exists == 1.0
    assert p.box == pytest.approx((30.0, 22 * 80 / 43, 45.0, 30 * 80 / 43), abs=0.01)
    assert p.point == pytest.approx((37.5, 26 * 80 / 43), abs=0.01)


def test_no_is_not_found(predictor, monkeypatch):
    pred, _ = answering(predictor, monkeypatch, "no", (0, 0))
    p = pred.point(Image.new("RGB", (64, 64)), "green heart")
    assert (p.found, p.point, p.box) == (False, None, None)
    assert json.loads(json.dumps(p.to_dict()))["found"] is False


def test_found_when_the_wordings_mean_probability_of_yes_is_at_least_a_half(predictor, monkeypatch):
    assert there([("yes", 0.9), ("no", 0.6)]) == pytest.approx(0.65) and there([("maybe", 0.8)]) == 0.5
    picture = Image.new("RGB", (64, 64))
    # one wording says no: the other's confident yes still finds it (the mean, 0.65)
    pred, _ = answering(predictor, monkeypatch, [("no", 0.6), ("yes", 0.9)], (2, 2))
    p = pred.point(picture, "red star")
    assert p.found and p.exists == pytest.approx(0.65) and p.box is not None
    monkeypatch.undo()
    # a confident no and a hesitant yes: not there (0.35)
    pred, _ = answering(predictor, monkeypatch, [("yes", 0.6), ("no", 0.9)], (2, 2))
    p = pred.point(picture, "red star")
    assert not p.found and p.exists == pytest.approx(0.35) and p.point is None


def test_the_padding_is_never_the_point(predictor, monkeypatch):
    wide = Image.new("RGB", (120, 40))  # rows 0-1 and 6-7 of the 8 x 8 grid are padding
    pred, _ = answering(predictor, monkeypatch, "yes", (0, 3))  # all the attention on a padding patch
    p, = pred.point_batch([wide], ["star"])
    x0, y0, x1, y1 = p.box
    assert 0 <= x0 < x1 <= 120 and 0 <= y0 < y1 <= 40 and x0 <= p.point[0] <= x1 and y0 <= p.point[1] <= y1
    # the picture fills rows 21..42 of the 64 px square: patch rows 2..5 of 8 touch it
    assert on_picture(120, 40, 8, 64, "letterbox").all(1).tolist() == [False, False, True, True,
                                                                       True, True, False, False]
    assert on_picture(120, 40, 8, 64, "squash").all()


def test_peak_patch_averages_and_keeps_to_the_allowed():
    maps = np.zeros((2, 1, 1, 4, 4))
    maps[0, ..., 1, 2], maps[1, ..., 3, 0] = 1.0, 0.6
    assert peak_patch(maps) == (1, 2)
    allowed = np.ones((4, 4), bool)
    allowed[1, 2] = False
    assert peak_patch(maps, allowed) == (3, 0)


def test_vqa_ask_point_prints_or_refuses(tmp_path, capsys):
    model, tok, card = shipped.load("tiny")
    from vqa.weights.checkpoint import save

    run = tmp_path / "ckpt"
    save(run, model, tok, card)
    img = tmp_path / "a.png"
    Image.new("RGB", (64, 64), (90, 90, 90)).save(img)
    assert main(["ask", "--checkpoint", str(run), "--point", str(img), "the red star", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"image", "phrase", "found", "point", "box", "exists", "colour"}
    assert main(["ask", "--checkpoint", str(run), "--point", "--top-k", "3", "--method", "beam", str(img), "star"]) == 2
    assert "--point finds one point per picture and object: no --top-k" in capsys.readouterr().err


def test_named_objects_and_an_absent_one():
    objs = [dict(kind="star", color="red"), dict(kind="star", color="blue"), dict(kind="ring", color="red")]
    assert named_objects("kind", objs) == [("red star", 0), ("blue star", 1), ("ring", 2)]
    twins = [dict(kind="star", color="red"), dict(kind="star", color="red")]
    assert named_objects("kind", twins) == []
    missing = absent_object(("star", "ring"), ("red", "blue"), "kind", objs, 7)
    assert missing == "blue ring" and absent_object(("star", "ring"), ("red", "blue"), "kind", objs, 8) == missing


def test_pointing_counts_by_hand(shapes_dir):
    pt = Pointing(None, None, load_scenes(shapes_dir, "val", "--pointing"))
    side = pt.scenes.side  # 64 px, an 8 x 8 grid of 8 px patches below
    box = (16, 16, 32, 32)  # patches 2..4 on each axis (edges included)

    def maps(row, col):
        m = np.zeros((1, 1, 1, 8, 8))
        m[..., row, col] = 1.0
        return m

    pt.score(False, maps(3, 3), box)  # a hit
    pt.score(False, maps(6, 6), box)  # a miss
    pt.score(True, maps(3, 3), box)  # said not there, its peak a hit all the same
    pt.score(True, maps(0, 0), None)  # absent, rightly said not there
    pt.score(False, maps(0, 0), None)
    s = pt.summary()
    assert (s["objects"], s["hits"], s["said_no"]) == (3, pytest.approx(66.67), pytest.approx(33.33))
    assert (s["absent"], s["absent_said_no"]) == (2, 50.0)
    assert side == 64 and s["chance"] == pytest.approx(100 * 4 / 64, abs=0.01)  # 2 x 2 centres of 64 in the box


def test_vqa_eval_pointing_writes_its_scores(shapes_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--data", str(shapes_dir), "--out", str(run), "--batch-size", "4", "--eval-images", "0",
                 "--max-steps", "1", *tiny_set_flags()]) == 0
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(run), "--data", str(shapes_dir), "--pointing", "--tasks", "vqa"]) == 0
    printed = capsys.readouterr().out
    s = json.loads((run / "best-eval-val" / "pointing.json").read_text())
    scenes = json.loads((shapes_dir / "shapes_val_scenes.json").read_text())["scenes"]
    assert s["objects"] == sum(len(named_objects("shape", sc["objects"])) for sc in scenes)
    assert s["absent"] == len(scenes) and 0 <= s["hits"] <= 100
    assert "pointing (" in printed and "absent objects said not there" in printed
