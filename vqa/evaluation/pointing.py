"""`vqa eval --pointing`: does `Predictor.point` find the objects of a Shapes or Scenes picture?

Each val picture is asked, for every object that its kind alone or its colour and kind names and no other
object fits, and for one colour and kind the picture lacks, the questions `Predictor.point` asks: "is there a
X?" and "can you see a X?" (`EXISTS_QS`: not there when the mean of its probability of "yes" is below one half,
`there`) and "what color is the X?" (`PROBE_Q`). The point is the centre of the patch the colour
answer's cross-attention weighs most (every layer's and head's mean over its tokens, `peak_patch`). Scores
(`pointing.json`, percentages):

- **hits**: named objects whose point lies in the object's box (edges included), the pointing game of Zhang et al.
  2016 on the model's own probe; **said no**: named objects the model says are not there;
- **absent**: objects the picture lacks that the model says are not there;
- **chance**: a random patch's centre (the share of patch centres in the box), averaged over the same objects.

Answers are decoded greedily, whatever the decoding options say (the maps are those of the greedy answer).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..config import GenerationConfig
from ..data.synthetic.scene_objects import SceneFile
from ..decoding.generate import generate, patch_maps
from .grounding import box_on_grid, chance

# two wordings of "is it there?": a model fine-tuned on one set's wording can drift on the other
EXISTS_QS, PROBE_Q = ("is there a {}?", "can you see a {}?"), "what color is the {}?"


def yes_probability(answer: str, probability: float) -> float:
    """The model's probability of "yes" from its answer and that answer's probability: all of it for "yes", the
    rest for "no", one half for any other answer."""
    said = answer.strip().lower()
    return probability if said == "yes" else 1.0 - probability if said == "no" else 0.5


def there(answers: Sequence[tuple[str, float]]) -> float:
    """The probability that an object is there: the mean of `yes_probability` over its `EXISTS_QS` answers."""
    return sum(yes_probability(a, p) for a, p in answers) / len(answers)


def peak_patch(maps: np.ndarray, allowed: np.ndarray | None = None) -> tuple[int, int]:
    """(row, column) of the most-weighed patch of maps [..., grid, grid] averaged over the leading axes, among
    `allowed` [grid, grid] (default all; the first in reading order on a tie)."""
    grid = maps.shape[-1]
    mean = maps.reshape(-1, grid, grid).mean(0)
    if allowed is not None:
        mean = np.where(allowed, mean, -1.0)
    return divmod(int(np.argmax(mean)), grid)


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
    """An `evaluate` observer: points at the named objects of each picture it is shown."""

    def __init__(self, model, tokenizer, scenes: SceneFile):
        scenes.require("box", "--pointing")
        self.model, self.tok, self.scenes = model, tokenizer, scenes
        self.seen: set = set()
        self.objects = self.hits = self.said_no = self.absent = self.absent_no = 0
        self.chance = 0.0

    def __call__(self, group, memory, generation) -> None:
        s, cfg = self.scenes, GenerationConfig.for_task("vqa", method="greedy")
        rows, names, boxes = [], [], []
        for r, meta in enumerate(group.meta):
            image_id = meta["image_id"]
            if image_id in self.seen or image_id not in s.scenes:
                continue
            self.seen.add(image_id)
            objs = s.scenes[image_id]["objects"]
            asks = [(n, objs[i]["box"]) for n, i in named_objects(s.set.kind, objs)]
            asks.append((absent_object(s.set.kinds, s.set.colours, s.set.kind, objs, image_id), None))
            for name, box in asks:
                rows.append(int(group.image_index[r]))
                names.append(name)
                boxes.append(box)
        if not names:
            return
        prompt = lambda q: self.tok.vqa_prompt(q, max_len=self.model.cfg.dec_max_len)  # noqa: E731
        asked = [generate(self.model, [prompt(q.format(n)) for n in names], memory=memory, image_index=rows,
                          config=cfg, banned=self.tok.never_generated) for q in EXISTS_QS]
        answers = [[(self.tok.decode(g.sequences[i]), math.exp(g.scores[i])) for g in asked] for i in range(len(names))]
        probes = [prompt(PROBE_Q.format(n)) for n in names]
        colour = generate(self.model, probes, memory=memory, image_index=rows, config=cfg,
                          banned=self.tok.never_generated)
        maps = patch_maps(self.model, memory, rows, probes, colour.sequences)
        for said, m, box in zip(answers, maps, boxes, strict=True):
            self.score(there(said) < 0.5, m.float().numpy(), box)

    def score(self, says_no: bool, maps: np.ndarray, box) -> None:
        """Counts one object: whether the model says it is not there, the probe's maps [G, L, H, grid, grid],
        its box in pixels (None for an object the picture lacks)."""
        if box is None:
            self.absent += 1
            self.absent_no += says_no
            return
        grid = maps.shape[-1]
        self.objects += 1
        self.said_no += says_no
        x0, y0, x1, y1 = box_on_grid(box, self.scenes.side, grid)
        self.chance += chance((x0, y0, x1, y1), grid)[1]
        row, col = peak_patch(maps)
        self.hits += x0 <= col + 0.5 <= x1 and y0 <= row + 0.5 <= y1

    def summary(self) -> dict:
        pct = lambda a, n: round(100 * a / n, 2) if n else 0.0  # noqa: E731
        return dict(scenes=str(self.scenes.path), objects=self.objects, hits=pct(self.hits, self.objects),
                    said_no=pct(self.said_no, self.objects), chance=pct(self.chance, self.objects),
                    absent=self.absent, absent_said_no=pct(self.absent_no, self.absent))


def format_pointing(s: dict) -> str:
    return (f"pointing ({s['objects']} named objects): {s['hits']:.1f}% of the points in the object's box "
            f"(chance {s['chance']:.1f}%), {s['said_no']:.1f}% said not there; {s['absent_said_no']:.1f}% of "
            f"{s['absent']} absent objects said not there")


__all__ = ["EXISTS_QS", "PROBE_Q", "Pointing", "absent_object", "format_pointing", "named_objects", "peak_patch",
           "there", "yes_probability"]
