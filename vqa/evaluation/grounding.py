"""`vqa eval --grounding`: does the decoder's cross-attention look at the object a word names?

On a Shapes or Scenes split (whose scenes file holds every object's box), each word that names one object
is scored against that object's box, in every cross-attention layer and head:

- the words: a colour or shape question's answer (all its tokens: "red" names the object asked about), and in
  a caption each phrase that names exactly one object ("small red circle"; `vqa.evaluation.scene_objects`);
  the words the model generated, their maps those of a teacher-forced pass (`patch_maps`), a phrase's map the
  mean of its tokens' maps;
- **mass in the box**: the share of the map's patch attention (the prefix tokens, which have no place, left
  out) that falls inside the box, a patch's weight spread evenly over its pixels (a patch half inside counts
  half);
- **pointing game** (Zhang et al. 2016, "Top-down Neural Attention by Excitation Backprop"): a hit when the
  map's maximum lies in the box. The maximum is known to a patch: the point is the centre of the
  most-attended patch (the first in reading order on a tie), with no tolerance (Zhang et al.'s 15 pixels are
  for pictures of ~500 pixels; here a patch is 8 of 64);
- chance: what a uniform map scores (the box's share of the picture) and a random patch (the share of patch
  centres in the box), averaged over the same words.

Scores are percentages averaged over the words, per layer and head and for the mean map of all layers and
heads (the explorer's default), over all words and for the answers and the captions apart; the best head is
the one with the most mass in the box.
"""

from __future__ import annotations

import numpy as np

from ..data.synthetic.scene_objects import ATTRIBUTE_FAMILIES, SceneFile, caption_mentions
from ..decoding.generate import patch_maps

SOURCES = ("answers", "captions")


def box_on_grid(box, side: int, grid: int) -> tuple[float, float, float, float]:
    """A box in picture pixels (left, top, right, bottom) in patch units of the model's grid: the pictures are
    square, so letterbox and squash both stretch them over the whole input."""
    return tuple(float(v) * grid / side for v in box)


def _overlap(n: int, lo: float, hi: float) -> np.ndarray:
    """[n]: how much of each unit cell [k, k + 1) the interval [lo, hi] covers (0..1)."""
    k = np.arange(n)
    return np.clip(np.minimum(k + 1, hi) - np.maximum(k, lo), 0, 1)


def mass_in_box(maps: np.ndarray, box) -> np.ndarray:
    """[...]: the share of each map's mass inside `box` (patch units) of maps [..., grid, grid]; 0 for an
    all-zero map."""
    g = maps.shape[-1]
    x0, y0, x1, y1 = box
    cover = _overlap(g, y0, y1)[:, None] * _overlap(g, x0, x1)[None, :]  # [grid (rows), grid (columns)]
    total = maps.sum((-2, -1))
    inside = (maps * cover).sum((-2, -1))
    return np.divide(inside, total, out=np.zeros_like(total, dtype=np.float64), where=total > 0)


def pointing_hits(maps: np.ndarray, box) -> np.ndarray:
    """[...] bool: the centre of each map's most-attended patch lies in `box` (patch units, edges included)."""
    g = maps.shape[-1]
    row, col = np.divmod(maps.reshape(*maps.shape[:-2], g * g).argmax(-1), g)  # [..., grid^2] -> [...]
    x, y = col + 0.5, row + 0.5
    x0, y0, x1, y1 = box
    return (x0 <= x) & (x <= x1) & (y0 <= y) & (y <= y1)


def chance(box, grid: int) -> tuple[float, float]:
    """(mass in the box of a uniform map, pointing hits of a random patch) for `box` in patch units."""
    cover = _overlap(grid, box[1], box[3])[:, None] * _overlap(grid, box[0], box[2])[None, :]
    centres = (np.arange(grid) + 0.5)
    inx = (box[0] <= centres) & (centres <= box[2])
    iny = (box[1] <= centres) & (centres <= box[3])
    return float(cover.sum() / grid**2), float(iny.sum() * inx.sum() / grid**2)


def words_of(pieces: list[str]) -> list[tuple[str, list[int]]]:
    """(word, token positions): a piece that starts with a space (the tokenizer's word marker) starts a word
    (as `Answer.words` joins them)."""
    out: list[tuple[str, list[int]]] = []
    for i, p in enumerate(pieces):
        if not out or p.startswith(" ") or not p.strip():
            out.append((p.strip(), [i]))
        else:
            out[-1] = (out[-1][0] + p, out[-1][1] + [i])
    return out


class Tally:
    """Sums of one source's scores: [L, H] per head, the mean map's, chance's."""

    def __init__(self) -> None:
        self.n = 0
        self.mass = self.hits = 0.0
        self.mean_mass = self.mean_hits = self.chance_mass = self.chance_hits = 0.0

    def add(self, maps: np.ndarray, box, grid: int) -> None:
        """maps [L, H, grid, grid] of one word against its object's `box` (patch units)."""
        self.n += 1
        self.mass = self.mass + mass_in_box(maps, box)
        self.hits = self.hits + pointing_hits(maps, box)
        mean = maps.mean((0, 1))  # [grid, grid]: all layers' and heads' mean, the explorer's default map
        self.mean_mass += float(mass_in_box(mean, box))
        self.mean_hits += float(pointing_hits(mean, box))
        c = chance(box, grid)
        self.chance_mass += c[0]
        self.chance_hits += c[1]

    def merged(self, other: Tally) -> Tally:
        out = Tally()
        for k in vars(out):
            setattr(out, k, getattr(self, k) + getattr(other, k))
        return out

    def summary(self) -> dict:
        """words; mass and pointing [layer][head]; the mean map's, chance's and the best head's scores (in %)."""
        if not self.n:
            return dict(words=0)

        def pct(v) -> np.ndarray:
            return np.round(100 * np.asarray(v, dtype=np.float64) / self.n, 2)

        mass, hits = pct(self.mass), pct(self.hits)
        layer, head = np.unravel_index(int(np.argmax(mass)), mass.shape)
        return dict(words=self.n, mass=mass.tolist(), pointing=hits.tolist(),
                    mean_map=dict(mass=float(pct(self.mean_mass)), pointing=float(pct(self.mean_hits))),
                    chance=dict(mass=float(pct(self.chance_mass)), pointing=float(pct(self.chance_hits))),
                    best_head=dict(layer=int(layer), head=int(head), mass=float(mass[layer, head]),
                                   pointing=float(hits[layer, head])))


class Grounding:
    """An `evaluate` observer: scores every object word of the answers and captions it is shown."""

    def __init__(self, model, tokenizer, scenes: SceneFile):
        scenes.require("box", "--grounding")
        self.model, self.tok, self.scenes = model, tokenizer, scenes
        self.tallies = {s: Tally() for s in SOURCES}

    def mentions(self, task: str, meta: dict, seq: list[int]) -> list[tuple[list[int], int]]:
        """(token positions, object index) of the words of one generated row that name an object."""
        scene = self.scenes.scenes.get(meta["image_id"])
        if scene is None or not seq:
            return []
        if task == "vqa":
            family = meta.get("question_type")
            if family not in ATTRIBUTE_FAMILIES:
                return []
            i = self.scenes.referent(meta["image_id"], family, meta["question"], meta["answers"][0])
            return [] if i is None else [(list(range(len(seq))), i)]
        words = words_of(self.tok.pieces(seq))
        return [([t for w in at for t in words[w][1]], i)
                for at, i in caption_mentions(self.scenes.set, scene, [w for w, _ in words])]

    def __call__(self, group, memory, generation) -> None:
        rows = []
        for r, (meta, seq) in enumerate(zip(group.meta, generation.sequences, strict=True)):
            if found := self.mentions(group.task, meta, seq):
                rows.append((r, meta["image_id"], found))
        if not rows:
            return
        prompts = group.prompts()
        maps = patch_maps(self.model, memory, [int(group.image_index[r]) for r, _, _ in rows],
                          [prompts[r] for r, _, _ in rows], [generation.sequences[r] for r, _, _ in rows])
        for (_, image_id, found), m in zip(rows, maps, strict=True):
            self.score("answers" if group.task == "vqa" else "captions", m.numpy(), image_id, found)

    def score(self, source: str, maps: np.ndarray, image_id, found: list[tuple[list[int], int]]) -> None:
        """Adds one row's words to `source`'s tally: maps [G, L, H, grid, grid] behind its G generated tokens,
        `found` (token positions, object index) in the scene of `image_id`."""
        grid = maps.shape[-1]
        objs = self.scenes.scenes[image_id]["objects"]
        for tokens, i in found:
            self.tallies[source].add(maps[tokens].mean(0), box_on_grid(objs[i]["box"], self.scenes.side, grid), grid)

    def summary(self) -> dict:
        every = self.tallies["answers"].merged(self.tallies["captions"])
        return dict(scenes=str(self.scenes.path), all=every.summary(),
                    **{s: self.tallies[s].summary() for s in SOURCES})


def format_grounding(s: dict) -> str:
    """The per layer and head table of all words: % mass in the box / % pointing hits."""
    a = s["all"]
    if not a["words"]:
        return "grounding: no answer or caption word names an object"
    heads = len(a["mass"][0])
    rows = [["layer", *(f"head {h}" for h in range(heads))]]
    rows += [[str(layer), *(f"{m:.1f} / {p:.1f}" for m, p in zip(ms, ps, strict=True))]
             for layer, (ms, ps) in enumerate(zip(a["mass"], a["pointing"], strict=True))]
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    b, mean, ch = a["best_head"], a["mean_map"], a["chance"]
    return "\n".join([
        f"grounding ({a['words']} words naming an object: {s['answers']['words']} answers, "
        f"{s['captions']['words']} in captions), % attention mass in its box / % pointing-game hits:",
        *("  " + "  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in rows),
        f"  mean map of all heads {mean['mass']:.1f} / {mean['pointing']:.1f}; chance {ch['mass']:.1f} / "
        f"{ch['pointing']:.1f}",
        f"  best head: layer {b['layer']} head {b['head']} ({b['mass']:.1f} / {b['pointing']:.1f})",
    ])


__all__ = ["Grounding", "Tally", "box_on_grid", "chance", "format_grounding", "mass_in_box", "pointing_hits",
           "words_of"]
