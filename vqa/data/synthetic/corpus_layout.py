"""Pretraining-corpus scenes: what one holds and where things go.

Broader than Shapes and Scenes on purpose: 1-5 objects of 12 kinds (circle, square, triangle, diamond,
pentagon, hexagon, octagon, star, heart, cross, arrow, ring), 10 colours, 5 fills (solid, hollow, striped,
dotted, checked), a continuous size (diameter 12-34% of the side) with a rotation, placed so that they may
overlap a little (centres at least 70% of the sum of their radii apart, so each stays mostly visible); a
background of its own (7 tinted colours, none grey and none of Scenes' palette, in 6 patterns) and one of 4
drawing styles (flat, outlined, ink, shadow). No Shapes or Scenes scene can come out: their backgrounds are
grey or Scenes' palette, never one of these.
"""

from __future__ import annotations

import numpy as np

from .generator import kind_and_colour
from .generator import relation_holds as spatial_holds

KINDS = ("circle", "square", "triangle", "diamond", "pentagon", "hexagon", "octagon", "star", "heart", "cross",
         "arrow", "ring")
COLOURS = {
    "red": (220, 40, 40), "orange": (245, 140, 20), "yellow": (240, 215, 40), "green": (40, 170, 70),
    "blue": (40, 90, 230), "purple": (150, 60, 200), "pink": (240, 120, 185), "brown": (125, 75, 35),
    "white": (250, 250, 248), "black": (20, 20, 24),
}
FILLS = ("solid", "hollow", "striped", "dotted", "checked")
BACKGROUNDS = {
    "cream": (236, 226, 196), "navy": (36, 48, 92), "teal": (38, 118, 118), "plum": (104, 54, 88),
    "olive": (118, 122, 52), "peach": (236, 180, 150), "sky": (150, 196, 232),
}
PATTERNS = ("plain", "gradient", "grid", "dots", "waves", "noise")
STYLES = ("flat", "outlined", "ink", "shadow")
DIAMETER = (0.12, 0.34)  # fraction of the image side
SIZE_WORDS = ((0.19, "small"), (0.27, "medium"), (1.0, "large"))  # diameter below each bound -> word
MAX_OBJECTS = 5  # a caption listing every object must fit the tiny decoder's 48 tokens
OVERLAP = 0.7  # centres at least this x the sum of the radii apart
REPEAT = 0.3  # chance that a new object copies the kind (and, separately, the colour) of an earlier one
BIGGER = 1.3  # "bigger than" needs this ratio of diameters


def size_word(o: dict, side: int) -> str:
    return next(w for bound, w in SIZE_WORDS if o["d"] < bound * side)


def relation_holds(a: dict, b: dict, rel: str, side: int) -> bool | None:
    """True/False if `a rel b` clearly holds / clearly fails, None if too close to say. Relations: left of,
    right of, above, below (centres apart by the margin of every set), bigger than, smaller than (two objects of
    one kind, diameters BIGGER x apart: across kinds a diameter says little about the area drawn)."""
    if rel in ("bigger than", "smaller than"):
        if a["kind"] != b["kind"]:
            return None
        big, small = (a, b) if rel == "bigger than" else (b, a)
        return True if big["d"] >= BIGGER * small["d"] else False if small["d"] >= BIGGER * big["d"] else None
    return spatial_holds(a, b, rel, side)


RELATIONS = ("left of", "right of", "above", "below", "bigger than", "smaller than")


def _place(rng: np.random.Generator, objs: list[dict], d: float, side: int) -> tuple[float, float] | None:
    border = max(2.0, 0.04 * side)
    for _try in range(80):
        x, y = rng.uniform(border + d / 2, side - border - d / 2, size=2)
        if all(np.hypot(x - o["x"], y - o["y"]) >= OVERLAP * (d + o["d"]) / 2 for o in objs):
            return float(x), float(y)
    return None


def make_scene(rng: np.random.Generator, side: int) -> dict:
    """Random objects (drawn in list order: later ones in front), a background, a pattern and a style."""
    n = int(rng.integers(1, MAX_OBJECTS + 1))
    objs: list[dict] = []
    while len(objs) < n:
        kind, colour = kind_and_colour(rng, objs, KINDS, tuple(COLOURS), REPEAT)
        d = float(rng.uniform(*DIAMETER)) * side
        while (at := _place(rng, objs, d, side)) is None and d > DIAMETER[0] * side:
            d *= 0.85
        if at is None:  # no room left: the scene starts again
            objs = []
            continue
        objs.append(dict(kind=kind, color=colour, fill=FILLS[rng.integers(len(FILLS))], x=round(at[0], 2),
                         y=round(at[1], 2), d=round(d, 2), angle=round(float(rng.uniform(0, 360)), 1)))
    background = list(BACKGROUNDS)[rng.integers(len(BACKGROUNDS))]
    return dict(objects=objs, background=background, pattern=PATTERNS[rng.integers(len(PATTERNS))],
                style=STYLES[rng.integers(len(STYLES))], texture_seed=int(rng.integers(2**31)))
