"""`Predictor.point(image, "the red star")`: where the model says a named object is, in pixels of the user's
picture.

The model is asked "where is the red star?". A model pretrained on the corpus (the tiny preset's towers, and
what is fine-tuned from them while it keeps the skill) answers with a location ("5 11 4": the centre's column
and row on a 16 x 16 grid over the picture it saw, and the object's diameter in cells;
`vqa.data.synthetic.locations`), or "nowhere" when the picture has no such object. The location is read back
through the letterbox into the picture's pixels: a point (the centre) and a box (the centre +- half the
diameter, clipped to the picture).

A model that answers something else (one never taught locations) still looked somewhere while answering: the
point is then the centre of the patch its cross-attention (every layer's and head's mean over the answer's
tokens) weighs most, the box that patch's, and `source` says "attention".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..data.images import load_image
from ..data.synthetic.locations import NOWHERE, WHERE_Q, parse_location
from ..errors import InputError
from .heatmaps import letterbox_box, patch_box


@dataclass
class Point:
    phrase: str  # what was looked for, as given
    found: bool  # False: the model says the picture has no such object
    point: tuple[float, float] | None  # (x, y) in pixels of the picture
    box: tuple[float, float, float, float] | None  # (left, top, right, bottom) in pixels of the picture
    source: str  # "location": the model's own answer; "attention": its attention's peak; "none": not found
    answer: str  # the model's answer to "where is the ...?"

    def to_dict(self) -> dict:
        r = lambda v: None if v is None else [round(float(x), 1) for x in v]  # noqa: E731
        return dict(phrase=self.phrase, found=self.found, point=r(self.point), box=r(self.box), source=self.source,
                    answer=self.answer)


def where_question(phrase: str) -> str:
    """'where is the red star?' for "the red star", "a red star" or "red star"."""
    if not isinstance(phrase, str) or not phrase.strip():
        raise InputError("point: name the object to find, e.g. \"the red star\"")
    words = phrase.strip().rstrip("?.!").split()
    if len(words) > 1 and words[0].lower() in ("the", "a", "an"):
        words = words[1:]
    return WHERE_Q[0].format(" ".join(words))


def to_picture(x: float, y: float, width: int, height: int, size: int, resize: str) -> tuple[float, float]:
    """A model-input pixel (of the size x size square) in the picture's pixels, through the letterbox."""
    left, top, right, bottom = letterbox_box(width, height, size, resize)
    px = (x - left) * width / (right - left)
    py = (y - top) * height / (bottom - top)
    return min(max(px, 0.0), float(width)), min(max(py, 0.0), float(height))


def on_picture(width: int, height: int, grid: int, size: int, resize: str) -> np.ndarray:
    """[grid, grid] bool: the patches that cover some of the picture (not only the letterbox's padding)."""
    left, top, right, bottom = letterbox_box(width, height, size, resize)
    lo = np.arange(grid) * size / grid
    hi = lo + size / grid
    return ((lo < bottom) & (hi > top))[:, None] & ((lo < right) & (hi > left))[None, :]


def point_batch(predictor, images: Sequence[Any], phrases: Sequence[str], **changes) -> list[Point]:
    """`Predictor.point` for each (image, phrase) pair, in one batched decoding."""
    pictures = [load_image(img) for img in images]
    questions = [where_question(p) for p in phrases]
    answers = predictor.answer_batch(pictures, questions, return_attention=True, **changes)
    size, resize, grid = predictor.cfg.vit_image_size, predictor.cfg.vit_resize, predictor.grid
    out = []
    for pic, phrase, ans in zip(pictures, phrases, answers, strict=True):
        w, h = pic.size
        text = ans.answer.strip()
        if text == NOWHERE:
            out.append(Point(phrase, False, None, None, "none", text))
            continue
        loc = parse_location(text, size, size)
        if loc is not None:
            (cx, cy), (x0, y0, x1, y1) = loc
            point = to_picture(cx, cy, w, h, size, resize)
            box = (*to_picture(x0, y0, w, h, size, resize), *to_picture(x1, y1, w, h, size, resize))
            out.append(Point(phrase, True, point, box, "location", text))
            continue
        peak = ans.attention.float().mean((0, 1, 2)).numpy()  # [G, L, H, g, g] -> [g, g]
        row, col = divmod(int(np.argmax(np.where(on_picture(w, h, grid, size, resize), peak, -1.0))), grid)
        box = patch_box(w, h, row, col, grid, size, resize)
        out.append(Point(phrase, True, ((box[0] + box[2]) / 2, (box[1] + box[3]) / 2), box, "attention", text))
    return out


__all__ = ["Point", "on_picture", "point_batch", "to_picture", "where_question"]
