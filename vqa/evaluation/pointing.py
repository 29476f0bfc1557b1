"""`vqa eval --pointing`: does the model say where a named object is?

On a Shapes or Scenes split (whose scenes file holds every object's box), each picture is asked "where is the
X?" (`vqa.data.synthetic.locations`, the question `Predictor.point` asks) for every object X that its kind
alone, or its colour and kind, names and no other object fits, and once for an object the picture lacks:

- **hit**: the answer is a location whose point (the centre it names) lies in the object's box, edges
  included; **nowhere**: the answer says there is no such object; anything else is **not a location**;
- **absent**: the share of objects the picture lacks for which the answer is "nowhere";
- chance: what a point drawn uniformly over the picture scores (the box's share of the picture), averaged over
  the same objects.

Answers are decoded greedily. A model never taught locations (nothing but "not a location") scores 0.
"""

from __future__ import annotations

import numpy as np

from ..config import GenerationConfig
from ..data.synthetic.locations import NOWHERE, WHERE_Q, parse_location
from ..decoding.generate import generate
from .scene_objects import SceneFile


def named_objects(kind_key: str, objs: list[dict]) -> list[tuple[str, int]]:
    """(name, index) of each object that its kind alone, or its colour and kind, names uniquely."""
    out = []
    for i, o in enumerate(objs):
        for keys in ((kind_key,), ("color", kind_key)):
            if sum(all(p[k] == o[k] for k in keys) for p in objs) == 1:
                out.append((" ".join(o[k] for k in keys), i))
                break
    return out


def absent_object(kinds, colours, kind_key: str, objs: list[dict], image_id: int) -> str:
    """A colour and kind that no object of the picture has, picked by the image id (the same every run)."""
    have = {(o["color"], o[kind_key]) for o in objs}
    options = [f"{c} {k}" for c in colours for k in kinds if (c, k) not in have]
    return options[np.random.default_rng(int(image_id)).integers(len(options))]


class Pointing:
    """An `evaluate` observer: asks where the named objects of each picture it is shown are."""

    def __init__(self, model, tokenizer, scenes: SceneFile):
        scenes.require("box", "--pointing")
        self.model, self.tok, self.scenes = model, tokenizer, scenes
        self.seen: set = set()
        self.objects = self.hits = self.nowhere = self.unread = 0
        self.absent = self.absent_right = 0
        self.chance = 0.0

    def __call__(self, group, memory, generation) -> None:
        s = self.scenes
        prompts, rows, truth = [], [], []
        for r, meta in enumerate(group.meta):
            image_id = meta["image_id"]
            if image_id in self.seen or image_id not in s.scenes:
                continue
            self.seen.add(image_id)
            objs = s.scenes[image_id]["objects"]
            asks = [(n, objs[i]["box"]) for n, i in named_objects(s.set.kind, objs)]
            asks.append((absent_object(s.set.kinds, s.set.colours, s.set.kind, objs, image_id), None))
            for name, box in asks:
                prompts.append(self.tok.vqa_prompt(WHERE_Q[0].format(name), max_len=self.model.cfg.dec_max_len))
                rows.append(int(group.image_index[r]))
                truth.append(box)
        if not prompts:
            return
        out = generate(self.model, prompts, memory=memory, image_index=rows,
                       config=GenerationConfig.for_task("vqa", method="greedy"), banned=self.tok.never_generated)
        for seq, box in zip(out.sequences, truth, strict=True):
            self.score(self.tok.decode(seq).strip(), box)

    def score(self, answer: str, box) -> None:
        """Counts one answer against the object's box (pixels), or None for an object the picture lacks."""
        if box is None:
            self.absent += 1
            self.absent_right += answer == NOWHERE
            return
        self.objects += 1
        side = self.scenes.side
        x0, y0, x1, y1 = box
        self.chance += (x1 - x0) * (y1 - y0) / side**2
        loc = parse_location(answer, side, side)
        if answer == NOWHERE:
            self.nowhere += 1
        elif loc is None:
            self.unread += 1
        else:
            (x, y), _ = loc
            self.hits += x0 <= x <= x1 and y0 <= y <= y1

    def summary(self) -> dict:
        pct = lambda a, n: round(100 * a / n, 2) if n else 0.0  # noqa: E731
        return dict(scenes=str(self.scenes.path), objects=self.objects, hits=pct(self.hits, self.objects),
                    nowhere=pct(self.nowhere, self.objects), not_a_location=pct(self.unread, self.objects),
                    chance=pct(self.chance, self.objects), absent=self.absent,
                    absent_nowhere=pct(self.absent_right, self.absent))


def format_pointing(s: dict) -> str:
    return (f"pointing ({s['objects']} named objects): {s['hits']:.1f}% of the points in the object's box "
            f"(chance {s['chance']:.1f}%), {s['nowhere']:.1f}% said nowhere, {s['not_a_location']:.1f}% not a "
            f"location; {s['absent_nowhere']:.1f}% of {s['absent']} absent objects said nowhere")


__all__ = ["Pointing", "absent_object", "format_pointing", "named_objects"]
