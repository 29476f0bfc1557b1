"""`Predictor.point`, `vqa ask --point` and `vqa eval --pointing`: a location answer read back into the user's
picture through the letterbox, "nowhere" as not found, the attention's peak for a model that answers no
location (never on the letterbox's padding), and the evaluation's counts by hand."""

import json

import pytest
from conftest import tiny_set_flags
from PIL import Image

from vqa.cli import main
from vqa.errors import InputError
from vqa.evaluation.pointing import Pointing, absent_object, named_objects
from vqa.evaluation.scene_objects import load_scenes
from vqa.inference.pointing import on_picture, to_picture, where_question
from vqa.inference.predict import Predictor
from vqa.model import shipped


@pytest.fixture(scope="module")
def predictor():
    model, tok, card = shipped.load("tiny")
    return Predictor(model, tok, card, device="cpu")


def answering(predictor, monkeypatch, text):
    """The predictor, its answers' text replaced by `text` (their attention maps kept: the model's own)."""
    real = predictor.answer_batch

    def fake(*args, **kwargs):
        out = real(*args, **kwargs)
        for a in out:
            a.answer = text
        return out

    monkeypatch.setattr(predictor, "answer_batch", fake)
    return predictor


def test_where_question_takes_the_phrase_as_a_user_writes_it():
    assert where_question("the red star") == where_question("a red star?") == "where is the red star?"
    assert where_question("ring") == "where is the ring?"
    with pytest.raises(InputError, match="name the object"):
        where_question("  ")


def test_a_location_comes_back_in_the_pictures_pixels(predictor, monkeypatch):
    # 120 x 80 letterboxed into 64 x 64: scale 64 / 120, the picture in rows 10..53 (43 px) of the square
    p = answering(predictor, monkeypatch, "8 8 4").point(Image.new("RGB", (120, 80)), "the red star")
    assert p.found and p.source == "location" and p.answer == "8 8 4"
    # cell 8 of 16 -> 34 px of 64 -> (34 * 120 / 64, (34 - 10) * 80 / 43); 4 cells: 26..42 px of 64
    assert p.point == pytest.approx((63.75, 24 * 80 / 43), abs=0.01)
    assert p.box == pytest.approx((48.75, 16 * 80 / 43, 78.75, 32 * 80 / 43), abs=0.01)
    assert to_picture(0, 0, 120, 80, 64, "letterbox") == (0.0, 0.0)  # clipped to the picture
    assert to_picture(32, 32, 100, 50, 64, "squash") == (50.0, 25.0)


def test_nowhere_is_not_found(predictor, monkeypatch):
    p = answering(predictor, monkeypatch, "nowhere").point(Image.new("RGB", (64, 64)), "green heart")
    assert (p.found, p.point, p.box, p.source) == (False, None, None, "none")
    assert json.loads(json.dumps(p.to_dict()))["found"] is False


def test_no_location_falls_back_to_the_attention_peak_on_the_picture(predictor, monkeypatch):
    wide = Image.new("RGB", (120, 40))  # rows of the square above and below the picture are padding
    pred = answering(predictor, monkeypatch, "red")
    p, = pred.point_batch([wide], ["star"])
    assert p.found and p.source == "attention"
    x0, y0, x1, y1 = p.box
    assert 0 <= x0 < x1 <= 120 and 0 <= y0 < y1 <= 40 and x0 <= p.point[0] <= x1 and y0 <= p.point[1] <= y1
    # the picture fills rows 21..42 of the 64 px square: patch rows 2..5 of 8 touch it
    assert on_picture(120, 40, 8, 64, "letterbox").all(1).tolist() == [False, False, True, True, True, True, False, False]
    assert on_picture(120, 40, 8, 64, "squash").all()


def test_vqa_ask_point_prints_or_refuses(predictor, tmp_path, capsys):
    model, tok, card = shipped.load("tiny")
    run = tmp_path / "ckpt"
    from vqa.model.checkpoint import save

    save(run, model, tok, card)
    img = tmp_path / "a.png"
    Image.new("RGB", (64, 64), (90, 90, 90)).save(img)
    assert main(["ask", "--checkpoint", str(run), "--point", str(img), "the red star", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"image", "phrase", "found", "point", "box", "source", "answer"}
    assert main(["ask", "--checkpoint", str(run), "--point", "--top-k", "3", "--method", "beam", str(img), "star"]) == 2
    assert "--point takes one IMAGE" in capsys.readouterr().err


def test_named_objects_and_an_absent_one():
    objs = [dict(kind="star", color="red"), dict(kind="star", color="blue"), dict(kind="ring", color="red")]
    assert named_objects("kind", objs) == [("red star", 0), ("blue star", 1), ("ring", 2)]
    twins = [dict(kind="star", color="red"), dict(kind="star", color="red")]
    assert named_objects("kind", twins) == []
    missing = absent_object(("star", "ring"), ("red", "blue"), "kind", objs, 7)
    assert missing == "blue ring" and absent_object(("star", "ring"), ("red", "blue"), "kind", objs, 8) == missing


def test_pointing_counts_by_hand(shapes_dir):
    pt = Pointing(None, None, load_scenes(shapes_dir, "val", "--pointing"))
    box = (16, 16, 32, 32)
    pt.score("6 6 4", box)  # cell 6 -> 26 px: inside
    pt.score("1 1 4", box)  # 6 px: outside
    pt.score("nowhere", box)
    pt.score("red", box)
    pt.score("nowhere", None)  # an absent object, rightly nowhere
    pt.score("3 3 1", None)
    s = pt.summary()
    assert (s["objects"], s["hits"], s["nowhere"], s["not_a_location"]) == (4, 25.0, 25.0, 25.0)
    assert (s["absent"], s["absent_nowhere"]) == (2, 50.0)
    assert s["chance"] == pytest.approx(100 * 256 / 64**2, abs=0.01)


def test_vqa_eval_pointing_writes_its_scores(shapes_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--data", str(shapes_dir), "--out", str(run), "--batch-size", "4", "--eval-images", "0",
                 "--max-steps", "1", *tiny_set_flags()]) == 0
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(run), "--data", str(shapes_dir), "--pointing", "--tasks", "vqa"]) == 0
    printed = capsys.readouterr().out
    s = json.loads((run / "best-eval-val" / "pointing.json").read_text())
    scenes = json.loads((shapes_dir / "shapes_val_scenes.json").read_text())["scenes"]
    named = sum(len(named_objects("shape", sc["objects"])) for sc in scenes)
    assert s["objects"] == named and s["absent"] == len(scenes)
    assert 0 <= s["hits"] + s["nowhere"] + s["not_a_location"] <= 100
    assert "pointing (" in printed and "absent objects said nowhere" in printed
    assert main(["eval", "--checkpoint", str(run), "--data", str(shapes_dir), "--pointing", "--tasks", "caption"]) == 2
    assert "--pointing asks questions" in capsys.readouterr().err
