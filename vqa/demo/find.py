"""The Find tab's handler: where the model says a named object is (`Predictor.point`), marked on a copy of the
user's picture in its own pixels (the box's outline and a ring at the point), with a line that says where, or
that the model says there is none (the picture then unmarked). Callable without a Gradio server:

    picture, line = Finder(pred).find("photo.png", "the red star")   # the page's /point endpoint
"""

from __future__ import annotations

from typing import Any

import gradio as gr
from PIL import Image, ImageDraw

from ..errors import VQAError
from ..inference.pointing import Point, object_words
from ..inference.serving import Busy
from .handlers import MAX_QUESTION_CHARS, busy, no_picture
from .uploads import DECODING, DecodeBudget, decoded_bytes, fail

MARK = (255, 0, 255)  # magenta: rare in photos and in the Shapes / Scenes colours


def mark_sizes(size: tuple[int, int]) -> tuple[int, int]:
    """(line width, ring radius) in pixels for a picture of `size`: visible at any size once scaled to fit."""
    side = max(size)
    return max(2, round(side / 160)), max(4, round(side / 40))


def marked(picture: Image.Image, found: Point) -> Image.Image:
    """A copy of `picture` with `found` drawn on it (its box's outline, a ring at its point); unmarked when
    the model says there is none."""
    out = picture.copy()
    if not found.found:
        return out
    width, radius = mark_sizes(out.size)
    left, top, right, bottom = (round(v) for v in found.box)
    draw = ImageDraw.Draw(out)
    draw.rectangle((left, top, max(left, right - 1), max(top, bottom - 1)), outline=MARK, width=width)
    x, y = found.point
    draw.ellipse((x - radius, y - radius, x + radius, y + radius), outline=MARK, width=width)
    return out


def found_line(found: Point) -> str:
    """What the page says of `found`, in markdown."""
    if not found.found:
        return (f"The model says there is no {object_words(found.phrase)} (its probability that there is one: "
                f"{found.exists:.0%}).")
    (x, y), (left, top, right, bottom) = found.point, found.box
    return (f"**{object_words(found.phrase)}**: found at ({x:.0f}, {y:.0f}), in the box ({left:.0f}, {top:.0f}) to "
            f"({right:.0f}, {bottom:.0f}), in the picture's pixels. The model's colour for it: {found.colour}.")


def check_object(phrase: Any) -> str:
    """The object to find, cut to MAX_QUESTION_CHARS; none named: a gr.Error."""
    if not isinstance(phrase, str) or not phrase.strip() or not object_words(phrase):
        raise gr.Error('Please name the object to find, e.g. "the red circle".', title="Nothing to find",
                       print_exception=False)
    return phrase[:MAX_QUESTION_CHARS]


class Finder:
    """The Find tab's `find` around `pred` (a `vqa.Predictor`, which serialises its calls); the decoded upload
    is held within `budget` (as the Ask tab's, `vqa.demo.handlers.Handlers`) until it is drawn on."""

    def __init__(self, pred, budget: DecodeBudget = DECODING):
        self.pred, self.budget = pred, budget

    def find(self, image: Any, phrase: Any) -> tuple[Image.Image, str]:
        """(the picture marked where the model says `phrase` is, the line that says so)."""
        if image is None:
            raise no_picture()
        phrase = check_object(phrase)
        try:
            with self.budget.hold(decoded_bytes(image)):
                picture = self.pred.load(image)
                found = self.pred.point(picture, phrase)
                return marked(picture, found), found_line(found)
        except Busy as e:
            raise busy(e) from None
        except VQAError as e:
            raise fail(e, image) from None


__all__ = ["Finder", "found_line", "mark_sizes", "marked", "MARK"]
