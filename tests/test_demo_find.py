"""The demo's Find tab called directly (`vqa.demo.handlers.Finder`): the picture comes back marked where
`Predictor.point` says the object is (changed on the box's outline and around the point, unchanged elsewhere),
with the line that says where; "no" gives the model's word and the picture unmarked; no picture or no object
named is a gr.Error. The /point endpoint through a server: tests/test_app.py, tests/test_demo_api.py."""

from __future__ import annotations

import numpy as np
import pytest
from demo_fixtures import error
from PIL import Image
from predict_fixtures import DEMO_WARNINGS, draw

gr = pytest.importorskip("gradio", reason="gradio is not installed (pip install -e '.[dev]')")

from vqa.demo.handlers import MARK, Finder, mark_sizes  # noqa: E402

pytestmark = DEMO_WARNINGS


@pytest.fixture(scope="module")
def finder(pred):
    return Finder(pred)


def test_the_picture_is_marked_around_the_box_in_its_own_pixels(finder, pred, tmp_path):
    path = tmp_path / "wide.png"
    draw("red_circle", (120, 80)).save(path)  # letterboxed: its box is mapped back into these 120 x 80 pixels
    upload = np.asarray(Image.open(path).convert("RGB")).astype(int)
    picture, line = finder.find(str(path), "the red circle")
    want = pred.point(str(path), "the red circle")
    assert want.found and picture.size == (120, 80)
    x, y = want.point
    assert line.startswith(f"**red circle**: found at ({x:.0f}, {y:.0f})")
    changed = (np.asarray(picture).astype(int) != upload).any(-1)  # [H, W]
    left, top, right, bottom = (round(v) for v in want.box)
    assert tuple(np.asarray(picture)[top, left]) == MARK and changed[bottom - 1, right - 1]  # the box's corners
    width, radius = mark_sizes(picture.size)
    near = np.zeros_like(changed)
    m = radius + width  # the ring around the point reaches this far from it
    near[max(0, top - m): bottom + m, max(0, left - m): right + m] = True
    assert changed.any() and not (changed & ~near).any()  # far pixels: the upload's own


def test_no_is_said_and_the_picture_left_unmarked(finder, pred, pictures, monkeypatch):
    real = pred.answer_batch

    def no(images, questions, **kwargs):
        out = real(images, questions, **kwargs)
        for a in out:
            if a.question.startswith(("is there", "can you see")):
                a.answer, a.top_k = "no", [("no", 0.8)]
        return out

    monkeypatch.setattr(pred, "answer_batch", no)
    picture, line = finder.find(str(pictures["blue_square"]), "the red star")
    assert line == "The model says there is no red star (its probability that there is one: 20%)."
    assert picture.tobytes() == Image.open(pictures["blue_square"]).convert("RGB").tobytes()


def test_no_picture_or_no_object_named_is_a_message(finder, pictures):
    assert error(finder.find, None, "the red circle").title == "No picture"
    for phrase in ("", "   ", "?", None):
        assert error(finder.find, str(pictures["red_circle"]), phrase).title == "Nothing to find"
