"""`Predictor.point(image, "the red star")`: where the model looks for a named object, in pixels of the user's
picture.

Three questions in one batch: "is there a red star?" and "can you see a red star?" (not found when the mean of
the model's probability of "yes" is below one half) and "what color is the red star?", which the model can only
answer by looking at the object. The point is the centre of the patch that
the cross-attention behind the colour answer weighs most (every layer's and head's mean over its tokens; patches
that cover only the letterbox's padding left out), read back through the letterbox into the picture's pixels;
the box is that patch's. How often the point lands in the object's box: `vqa eval --pointing`. Over a collection
(`vqa ask photos/ "the red star" --point --out points.jsonl`): `locate`, from `vqa.inference.collection.job`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError
from ..evaluation.pointing import EXISTS_QS, PROBE_Q, peak_patch, there
from .heatmaps import letterbox_box, patch_box


@dataclass
class Point:
    phrase: str  # what was looked for, as given
    found: bool  # False: `exists` is below one half
    point: tuple[float, float] | None  # (x, y) in pixels of the picture
    box: tuple[float, float, float, float] | None  # (left, top, right, bottom): the patch, in pixels of the picture
    exists: float  # the model's probability that it is there (`vqa.evaluation.pointing.there`)
    colour: str  # its answer to "what color is the ...?", whose attention gives the point

    def to_dict(self) -> dict:
        r = lambda v: None if v is None else [round(float(x), 1) for x in v]  # noqa: E731
        return dict(phrase=self.phrase, found=self.found, point=r(self.point), box=r(self.box),
                    exists=round(self.exists, 4), colour=self.colour)


def object_words(phrase: str) -> str:
    """'red star' of "the red star", "a red star?" or "red star"."""
    if not isinstance(phrase, str) or not phrase.strip():
        raise InputError("point: name the object to find, e.g. \"the red star\"")
    words = phrase.strip().rstrip("?.!").split()
    return " ".join(words[1:] if len(words) > 1 and words[0].lower() in ("the", "a", "an") else words)


def on_picture(width: int, height: int, grid: int, size: int, resize: str) -> np.ndarray:
    """[grid, grid] bool: the patches that cover some of the picture (not only the letterbox's padding)."""
    left, top, right, bottom = letterbox_box(width, height, size, resize)
    lo = np.arange(grid) * size / grid
    hi = lo + size / grid
    return ((lo < bottom) & (hi > top))[:, None] & ((lo < right) & (hi > left))[None, :]


def locate(predictor, inputs: Sequence[Any], sizes: Sequence[tuple[int, int]], phrases: Sequence[str],
           generation=None, **changes) -> list[Point]:
    """`Predictor.point_batch` of pictures already read: `inputs` as `answer_batch` takes them (a picture or its model
    input, as a collection's loader makes it), `sizes` each picture's (width, height), where the points go."""
    names = [object_words(p) for p in phrases]
    questions = [q.format(n) for q in (*EXISTS_QS, PROBE_Q) for n in names]
    answers = predictor.answer_batch(list(inputs) * (len(EXISTS_QS) + 1), questions, generation=generation,
                                     return_attention=True, **changes)
    k = len(names)
    asked, probes = [answers[i * k: (i + 1) * k] for i in range(len(EXISTS_QS))], answers[len(EXISTS_QS) * k:]
    exists = [there([(a[b].answer, a[b].top_k[0][1]) for a in asked]) for b in range(k)]
    size, resize, grid = predictor.cfg.vit_image_size, predictor.cfg.vit_resize, predictor.grid
    out = []
    for (w, h), phrase, p_there, probe in zip(sizes, phrases, exists, probes, strict=True):
        if p_there < 0.5:
            out.append(Point(phrase, False, None, None, p_there, probe.answer))
            continue
        row, col = peak_patch(probe.attention.float().numpy(), on_picture(w, h, grid, size, resize))
        box = patch_box(w, h, row, col, grid, size, resize)
        out.append(Point(phrase, True, ((box[0] + box[2]) / 2, (box[1] + box[3]) / 2), box, p_there,
                         probe.answer))
    return out


__all__ = ["Point", "locate", "object_words", "on_picture"]
