"""`vqa ask --point` over a collection: one JSON line per picture and object, its point and box equal to
`Predictor.point` one by one (a letterboxed picture's in its own pixels), "no" as found=false with no point,
resumed as answers are, and never resumed into (or from) an output of answers."""

from __future__ import annotations

import json

import pytest
from collect_fixtures import png, records
from predict_fixtures import shared_checkpoint

from vqa.cli import main
from vqa.inference.predict import Predictor

FIELDS = {"image", "phrase", "found", "point", "box", "exists", "colour", "settings"}


@pytest.fixture(scope="module")
def ckpt():
    return shared_checkpoint().parent  # the run folder


@pytest.fixture(scope="module")
def pred(ckpt):
    return Predictor.from_pretrained(ckpt, device="cpu", compile=False)


def pictures(root, sizes=((48, 36), (120, 80), (40, 64))):
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for i, size in enumerate(sizes):
        p = root / f"{i}.png"
        p.write_bytes(png(("red_circle", "blue_square")[i % 2], size))
        out.append(p)
    return out


def test_a_folders_points_are_predictor_point_one_by_one_and_a_rerun_redoes_nothing(ckpt, pred, tmp_path, capsys):
    files = pictures(tmp_path / "photos")
    out = tmp_path / "points.jsonl"
    argv = ["ask", "--checkpoint", str(ckpt), str(tmp_path / "photos"), "the red circle", "--point", "--out",
            str(out), "--batch-size", "2", "--workers", "1"]
    assert main(argv) == 0
    recs = records(out)
    assert [r["image"] for r in recs] == [str(f) for f in files]
    for r, f in zip(recs, files, strict=True):
        want = pred.point(f, "the red circle").to_dict()
        assert set(r) == FIELDS and r["phrase"] == "the red circle" and want["found"]
        assert [r[k] for k in ("phrase", "found", "exists", "colour")] == [want[k] for k in ("phrase", "found",
                                                                                         "exists", "colour")]
        assert r["point"] + r["box"] == pytest.approx(want["point"] + want["box"], abs=0.11)  # 0.1 px rounding
    x0, y0, x1, y1 = recs[1]["box"]  # the 120 x 80 picture: its box in its own pixels, never on the padding
    assert 0 <= x0 < x1 <= 120 and 0 <= y0 < y1 <= 80

    capsys.readouterr()
    before = out.read_text()
    assert main(argv) == 0 and out.read_text() == before  # all done: nothing redone
    assert "3 already in" in capsys.readouterr().err
    lines = before.splitlines(keepends=True)
    out.write_text("".join(lines[:2]))
    assert main(argv) == 0 and out.read_text() == before  # the missing line only
    assert "1 records written" in capsys.readouterr().err

    answers = [a for a in argv if a != "--point"]  # answers into an output of points: other settings, refused
    assert main(answers) == 2
    err = capsys.readouterr().err
    assert "its records were made with other settings" in err and "ask, weights" in err
    assert out.read_text() == before


def test_a_questions_file_of_objects_and_a_no_as_not_found(ckpt, pred, tmp_path, monkeypatch):
    pictures(tmp_path / "p", [(48, 36)])
    qs = tmp_path / "objects.jsonl"
    lines = [dict(image="p/0.png", question="the red circle", question_id="a"),
             dict(image="p/0.png", question="the green heart"),
             dict(image="p/missing.png", question="the red circle")]
    qs.write_text("".join(json.dumps(x) + "\n" for x in lines))
    want = pred.point(tmp_path / "p" / "0.png", "the red circle").to_dict()
    real = Predictor.answer_batch

    def no_heart(self, images, questions, **kwargs):  # the model says there is no green heart
        out = real(self, images, questions, **kwargs)
        for a in out:
            if a.question in ("is there a green heart?", "can you see a green heart?"):
                a.answer, a.top_k = "no", [("no", 0.9)]
        return out

    monkeypatch.setattr(Predictor, "answer_batch", no_heart)
    out = tmp_path / "points.jsonl"
    assert main(["ask", "--checkpoint", str(ckpt), "--questions", str(qs), "--point", "--out", str(out),
                 "--workers", "0"]) == 1  # the missing picture
    found, heart, missing = records(out)
    assert found["question_id"] == "a" and found["point"] == pytest.approx(want["point"], abs=0.11)
    assert (heart["phrase"], heart["found"], heart["point"], heart["box"], heart["exists"]) == \
        ("the green heart", False, None, None, pytest.approx(0.1))
    assert missing["phrase"] == "the red circle" and "image file not found" in missing["error"]
