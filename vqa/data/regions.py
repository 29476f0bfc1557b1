"""Grounded rows: which tokens of a training row name which object of a Shapes or Scenes picture, and how much
of each image patch that object covers. These are the targets of the grounding loss (`--grounding-weight`,
`VQAModel.forward`), which teaches the cross-attention behind a word to look at the object it names.

A row's grounded tokens (the objects are found with the generator's own tables,
`vqa.data.synthetic.scene_objects`, as `vqa eval --grounding` finds them):

- the last token of each phrase that names exactly one object ("the small red circle", in a question or a
  caption): the query there has read the whole phrase;
- the answer of a colour or shape question (every query that writes an answer token or <eos>): its object;
- the answer of a count question: the objects it counts (no target when it counts none).

A target is the object's box (for a count, the union of the boxes) spread over the patch grid, each patch
weighed by the share of it that the box covers, the weights summing to 1. The box follows the picture's
training shift and flip (`ImageTransform.augment_moves`).
"""

from __future__ import annotations

import bisect
import re
from pathlib import Path

import numpy as np

from .synthetic import scene_objects as so


def _overlap(n: int, lo: float, hi: float) -> np.ndarray:
    """[n]: how much of each unit cell [k, k + 1) the interval [lo, hi] covers (0..1)."""
    return np.array([min(max(min(k + 1, hi) - max(k, lo), 0.0), 1.0) for k in range(n)])


def box_cover(boxes: list, grid: int) -> np.ndarray | None:
    """[grid * grid] float32: the share of each patch that the union of `boxes` (in patch units: left, top,
    right, bottom) covers, normalized to sum 1; None when they cover nothing (moved off the picture)."""
    cover = np.zeros((grid, grid))
    for x0, y0, x1, y1 in boxes:
        cover = np.maximum(cover, np.outer(_overlap(grid, y0, y1), _overlap(grid, x0, x1)))
    total = cover.sum()
    return (cover / total).reshape(-1).astype(np.float32) if total > 0 else None


GENERIC = frozenset({"object", "thing"})  # Shapes' and Scenes' noun for an object of any kind


def described(sset, objs: list[dict], question: str) -> int | None:
    """The one object that "the small red object" / "the pink thing" of `question` fits (its colour and size
    words before the generic noun), or None: the generator's referent then decides, more slowly."""
    words = [w.strip(so.PUNCTUATION).lower() for w in question.split()]
    for n, w in enumerate(words):
        if w in GENERIC:
            fixed, k = {}, n
            while k > 0 and (words[k - 1] in sset.adjectives or words[k - 1] in sset.fillers):
                k -= 1
                if words[k] in sset.adjectives:
                    key, value = sset.adjectives[words[k]]
                    fixed[key] = value
            if k > 0 and words[k - 1] not in ("the", "a", "an"):  # "the biggest white thing": not by attributes
                return None
            fits = [i for i, o in enumerate(objs) if all(o.get(key) == v for key, v in fixed.items())]
            return fits[0] if fixed and len(fits) == 1 else None
    return None


class Regions:
    """The grounded tokens of a split's rows (`attach`), from its `<prefix>_<split>_scenes.json`."""

    def __init__(self, scenes: so.SceneFile, tokenizer, size: int, grid: int):
        scenes.require("box", "--grounding-weight")
        self.scenes, self.tok, self.size, self.grid = scenes, tokenizer, int(size), int(grid)
        self._ends: dict[str, list[int]] = {}  # text -> per word, the index of its last token
        self._found: dict[tuple, list] = {}  # a row -> its grounded tokens (`grounded`)

    @classmethod
    def of(cls, data_dir: str | Path, split: str, tokenizer, size: int, grid: int) -> Regions | None:
        """The split's regions when `data_dir` is a Shapes or Scenes folder (None for any other data)."""
        for s in so.SETS:
            if (Path(data_dir) / f"{s.spec.prefix}_{split}_scenes.json").is_file():
                return cls(so.load_scenes(data_dir, split, "--grounding-weight"), tokenizer, size, grid)
        return None

    @classmethod
    def for_training(cls, split_data, split: str, tokenizer, cfg, weight: float, say=None) -> Regions | None:
        """`vqa train --grounding-weight`'s targets: None when the weight is 0 or the data has no object boxes
        (not a Shapes or Scenes folder); `say` gets a line that tells which."""
        folder = getattr(split_data, "data_dir", None)
        if weight <= 0:
            return None
        regions = None if folder is None else cls.of(folder, split, tokenizer, cfg.vit_image_size, cfg.grid)
        if say is not None:
            say(f"vqa train: grounding loss (weight {weight:g}) on the objects of {regions.scenes.path}" if regions
                else "vqa train: no grounding loss: the data has no object boxes (a Shapes or Scenes folder has them)")
        return regions

    def word_ends(self, text: str) -> list[int]:
        """For each whitespace word of `text`, the index of its last token in `tokenizer.encode(text)` (its
        trailing punctuation left out), from one encoding's character offsets."""
        ends = self._ends.get(text)
        if ends is None:
            starts = [a for a, _ in self.tok.hf.encode(text, add_special_tokens=False).offsets]
            ends = []
            for word in re.finditer(r"\S+", text):
                w = word.group()
                ends.append(bisect.bisect_left(starts, word.start() + len(w.rstrip(so.PUNCTUATION) or w)) - 1)
            if len(self._ends) < 200_000:
                self._ends[text] = ends
        return ends

    def _targets(self, boxes: list, moves: tuple[int, int, bool]) -> np.ndarray | None:
        """The patch target of pixel boxes on the scene's picture, after the picture's moves."""
        dx, dy, flipped = moves
        scale, s = self.size / self.scenes.side, self.size
        moved = []
        for x0, y0, x1, y1 in boxes:
            x0, x1, y0, y1 = x0 * scale + dx, x1 * scale + dx, y0 * scale + dy, y1 * scale + dy
            if flipped:
                x0, x1 = s - x1, s - x0
            moved.append(tuple(v * self.grid / s for v in (x0, y0, x1, y1)))
        return box_cover(moved, self.grid)

    def grounded(self, row: dict) -> list[tuple[int, tuple[int, ...]]]:
        """(position in the row, the objects it names) of each grounded token of a row; kept per row, since
        every epoch asks again and only the picture's moves change."""
        meta = row["meta"]
        image_id = meta.get("image_id")
        text = meta.get("question") if row["task"] == "vqa" else meta.get("caption")
        key = (image_id, row["task"], text, row["prompt_len"], len(row["input_ids"]))
        if key not in self._found:
            self._found[key] = self._grounded(row, text) if image_id in self.scenes.scenes and text else []
        return self._found[key]

    def _grounded(self, row: dict, text: str) -> list[tuple[int, tuple[int, ...]]]:
        meta = row["meta"]
        scene = self.scenes.scenes[meta["image_id"]]
        start = 2 if row["task"] == "vqa" else row["prompt_len"]  # <bos> <question> q... / <bos> <caption> c...
        last = row["prompt_len"] - 2 if row["task"] == "vqa" else len(row["input_ids"]) - 1
        ends = self.word_ends(text)
        mentions = so.caption_mentions(self.scenes.set, scene, text.split())
        found = [(start + ends[words[-1]], (i,)) for words, i in mentions if start + ends[words[-1]] <= last]
        if row["task"] == "vqa":
            family, answers = meta.get("question_type"), meta.get("answers") or [""]
            named: list[int] | None = None
            if family in so.ATTRIBUTE_FAMILIES:  # the one object the question names, else the generator's referent
                i = mentions[0][1] if len(mentions) == 1 else described(self.scenes.set, scene["objects"], text)
                if i is None:
                    i = self.scenes.referent(meta["image_id"], family, meta["question"], answers[0])
                named = None if i is None else [i]
            elif family == "count":
                named = so.counted(self.scenes.set, scene, meta["question"]) or None
            if named:
                found += [(at, tuple(named)) for at in range(row["prompt_len"] - 1, len(row["input_ids"]) - 1)]
        return found

    def row_regions(self, row: dict, moves: tuple[int, int, bool]) -> tuple[list[int], np.ndarray] | None:
        """(positions in the row, targets [G, grid * grid]) of a row's grounded tokens, or None."""
        found = self.grounded(row)
        if not found:
            return None
        objs = self.scenes.scenes[row["meta"]["image_id"]]["objects"]
        positions, targets, made = [], [], {}
        for at, named in found:
            if named not in made:
                made[named] = self._targets([objs[i]["box"] for i in named], moves)
            if made[named] is not None:
                positions.append(at)
                targets.append(made[named])
        return (positions, np.stack(targets)) if positions else None

    def attach(self, rows: list[dict], moves: tuple[int, int, bool]) -> None:
        """Sets row["regions"] on each row that has grounded tokens."""
        for row in rows:
            got = self.row_regions(row, moves)
            if got is not None:
                row["regions"] = got


__all__ = ["Regions", "box_cover"]
