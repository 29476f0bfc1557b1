"""`vqa eval --consistency`: does the answer change as the picture does?

On a Shapes or Scenes split, some questions get a counterfactual twin drawn by the set's own generator from
the scenes file, one edit that fixes the twin's answer (`make_pair`):

- **mirror**: a spatial question that says left or right, asked of the picture flipped left to right: a yes
  becomes a no and a no a yes (the generator's relations need a 10% margin, which a mirror keeps);
- **recolour**: a colour question, its object painted another colour of the set (the question names it by
  size and shape, so it still names it): the answer is the new colour;
- **remove**: a count question with an answer of one or more, one of the counted objects taken out: the
  answer drops by one.

The original answer is the one `vqa eval` gives (the observer keeps it); the twin is asked with the same
decoding. A pair is **consistent when both answers are right** (Shah et al. 2019's consensus over a
question's variants, here the two; Ray et al. 2019's consistency conditions the second on the first and is
reported beside it as `consistent_given_original_right`). Answers are compared after the VQA normalization
("two" = "2").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image, ImageOps

from ..data.synthetic.scene_objects import SceneFile, counted
from ..data.transforms import build_transform
from ..decoding.compiled import encode as encode_images
from ..decoding.generate import generate
from ..errors import DataError
from .evaluate import text_table
from .metrics import normalize_answer

FAMILIES = ("mirror", "recolour", "remove")
LEFT_RIGHT = re.compile(r"\b(left|right)\b")


@dataclass
class Pair:
    family: str  # one of FAMILIES
    question_id: int | str
    question: str
    image_id: int | str
    image: str  # the original picture's file
    answer: str  # the right answer on the original
    changed: str  # the right answer on the twin
    scene: dict | None  # the twin's scene, drawn by the generator; None: the original picture mirrored


def make_pair(scenes: SceneFile, meta: dict) -> Pair | None:
    """The counterfactual twin of one question (`meta` as evaluation's rows hold it), or None when its
    question has none."""
    scene = scenes.scenes.get(meta["image_id"])
    family, question, answer = meta.get("question_type"), meta["question"], meta["answers"][0]
    if scene is None:
        return None
    base = dict(question_id=meta["question_id"], question=question, image_id=meta["image_id"], image=meta["image"],
                answer=answer)
    if family == "spatial" and LEFT_RIGHT.search(question) and answer in ("yes", "no"):
        return Pair("mirror", changed="no" if answer == "yes" else "yes", scene=None, **base)
    objs = scene["objects"]
    if family == "attribute_color":
        i = scenes.referent(meta["image_id"], family, question, answer)
        if i is None:
            return None
        others = [c for c in scenes.set.colours if c != objs[i]["color"]]
        new = others[hash_id(meta["question_id"]) % len(others)]
        twin = [dict(o, color=new) if j == i else o for j, o in enumerate(objs)]
        return Pair("recolour", changed=new, scene=dict(scene, objects=twin), **base)
    if family == "count":
        which = counted(scenes.set, scene, question)
        if not which:
            return None
        if str(len(which)) != answer:
            raise DataError(f"{scenes.path}: image {meta['image_id']} has {len(which)} objects that {question!r} "
                            f"counts, its answer says {answer}; the scenes file is not the one of these questions")
        gone = which[-1]  # the last counted object in the scene's list
        twin = [o for j, o in enumerate(objs) if j != gone]
        return Pair("remove", changed=str(len(which) - 1), scene=dict(scene, objects=twin), **base)
    return None


def hash_id(qid: int | str) -> int:
    """A question id as a number that picks the new colour (the same for every run)."""
    return int(qid) if str(qid).isdigit() else sum(map(ord, str(qid)))


def right(prediction: str, answer: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(answer)


def _percent(k: int, n: int) -> float | None:
    return round(100 * k / n, 2) if n else None


def score_pairs(pairs: list[Pair], original: dict, twin: dict) -> dict:
    """Per family and over all: pairs, % consistent (both answers right), % right on the originals and on the
    twins, and % of the twins right among the pairs whose original is right. `original` / `twin`: the
    model's answers by question id."""
    def one(rows: list[Pair]) -> dict:
        o = [right(original[p.question_id], p.answer) for p in rows]
        t = [right(twin[p.question_id], p.changed) for p in rows]
        both = [a and b for a, b in zip(o, t, strict=True)]
        n = len(rows)
        return dict(pairs=n, consistent=_percent(sum(both), n), original_accuracy=_percent(sum(o), n),
                    twin_accuracy=_percent(sum(t), n), consistent_given_original_right=_percent(sum(both), sum(o)))

    out = {f: one([p for p in pairs if p.family == f]) for f in FAMILIES}
    out["all"] = one(pairs)
    return out


class Consistency:
    """An `evaluate` observer that keeps the questions with a twin and the model's answers to them; `ask`
    then asks the twins and scores the pairs."""

    def __init__(self, tokenizer, scenes: SceneFile):
        scenes.require("texture_seed", "--consistency")
        self.tok, self.scenes = tokenizer, scenes
        self.pairs: list[Pair] = []
        self.original: dict = {}

    def __call__(self, group, memory, generation) -> None:
        if group.task != "vqa":
            return
        for meta, seq in zip(group.meta, generation.sequences, strict=True):
            if pair := make_pair(self.scenes, meta):
                self.pairs.append(pair)
                self.original[pair.question_id] = self.tok.decode(seq)

    def picture(self, pair: Pair) -> Image.Image:
        if pair.scene is None:
            return ImageOps.mirror(Image.open(pair.image).convert("RGB"))
        return self.scenes.draw(pair.scene)

    def check_drawing(self) -> None:
        """The generator draws the original of the first edited pair as its file shows it, so a twin differs
        from its original by the edit alone."""
        pair = next((p for p in self.pairs if p.scene is not None), None)
        if pair is None:
            return
        drawn = self.scenes.draw(self.scenes.scenes[pair.image_id])
        if not np.array_equal(np.asarray(drawn), np.asarray(Image.open(pair.image).convert("RGB"))):
            raise DataError(f"{self.scenes.path}: the generator does not draw {pair.image} as it is (built by another "
                            f"version?); build the set again to evaluate --consistency")

    @torch.no_grad()
    def ask(self, model, generation, device="cpu", batch_images: int = 64, compile: bool = False) -> dict:
        """Asks every twin (`batch_images` at a time) and returns the scores (`score_pairs`) with the pairs'
        definition."""
        self.check_drawing()
        transform = build_transform(model.cfg, train=False)
        twin: dict = {}
        was_training = model.training
        model.eval()
        for start in range(0, len(self.pairs), batch_images):
            chunk = self.pairs[start : start + batch_images]
            images = torch.stack([transform(self.picture(p)) for p in chunk]).to(device)  # [B, 3, S, S]
            memory = encode_images(model, images, compile)
            prompts = [self.tok.vqa_prompt(p.question, model.cfg.dec_max_len) for p in chunk]
            out = generate(model, prompts, memory=memory, config=generation, banned=self.tok.never_generated,
                           compile=compile)
            twin.update((p.question_id, self.tok.decode(s)) for p, s in zip(chunk, out.sequences, strict=True))
        model.train(was_training)
        return dict(scenes=str(self.scenes.path), definition="both answers right",
                    families=score_pairs(self.pairs, self.original, twin))


def format_consistency(s: dict) -> str:
    rows = [["", "pairs", "consistent", "original", "twin", "given original right"]]
    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    for f, r in s["families"].items():
        rows.append([f, str(r["pairs"]), fmt(r["consistent"]), fmt(r["original_accuracy"]), fmt(r["twin_accuracy"]),
                     fmt(r["consistent_given_original_right"])])
    return "\n".join(["consistency (% of pairs with both answers right; % right on the originals and on the twins):",
                      *text_table(rows)])


__all__ = ["Consistency", "FAMILIES", "Pair", "format_consistency", "make_pair", "right", "score_pairs"]
