"""Scenes scenes: what one holds and where things go.

1-6 objects: 6 kinds (star, heart, cross, ring, hexagon, arrow), 6 colours (pink, brown, cyan, white, black,
lime), a continuous size (diameter 15-28% of the image side) and a rotation; kept apart as circles, clear of
the border by 5% of the side. The background is one of 4 muted colours (sand, slate, sage, mauve) in one of 4
patterns (checkerboard, stripes, soft blobs, a floor below a horizon); half of the scenes have 1-3 thin
scratches behind the objects (clutter that is never counted). Spatial relations reuse Shapes' rule (centres
apart by 10% of the side); a superlative ("the biggest star") needs the biggest at least 1.25x the next.
"""

from __future__ import annotations

import numpy as np

from .generator import kind_and_colour

KINDS = ("star", "heart", "cross", "ring", "hexagon", "arrow")
COLOURS = {
    "pink": (240, 105, 175), "brown": (130, 78, 36), "cyan": (40, 210, 225),
    "white": (248, 248, 244), "black": (22, 22, 26), "lime": (160, 225, 40),
}
PALETTES = {"sand": (184, 164, 124), "slate": (96, 110, 138), "sage": (122, 146, 112), "mauve": (150, 118, 140)}
STYLES = ("checkerboard", "stripes", "blobs", "horizon")
DIAMETER = (0.15, 0.28)  # fraction of the image side (Shapes: 0.14 and 0.25)
# max turn, degrees
ROTATES = {"star": 36.0, "heart": 25.0, "cross": 45.0, "ring": 0.0, "hexagon": 30.0, "arrow": 360.0}
REPEAT = 0.35  # chance that a new object copies the kind (and, separately, the colour) of an earlier one
SUPERLATIVE = 1.25  # "the biggest X" only when it is this much bigger than the next X (and "smallest" alike)


def extreme(objs: list[dict], which: str) -> dict | None:
    """The clearly biggest ("biggest") or smallest ("smallest") of 2+ objects, else None."""
    if len(objs) < 2:
        return None
    ranked = sorted(objs, key=lambda o: o["d"], reverse=which == "biggest")
    first, second = ranked[0]["d"], ranked[1]["d"]
    clear = first >= SUPERLATIVE * second if which == "biggest" else second >= SUPERLATIVE * first
    return ranked[0] if clear else None


def _place(rng: np.random.Generator, objs: list[dict], d: float, side: int) -> tuple[float, float] | None:
    border, gap = max(3.0, 0.05 * side), max(2.0, 0.03 * side)
    for _try in range(60):
        x, y = rng.uniform(border + d / 2, side - border - d / 2, size=2)
        if all(np.hypot(x - o["x"], y - o["y"]) >= (d + o["d"]) / 2 + gap for o in objs):
            return float(x), float(y)
    return None


def make_scene(rng: np.random.Generator, side: int) -> dict:
    """Random objects that do not touch, a background and some clutter; an object that finds no room after
    60 tries is tried again 15% smaller (down to 10% of the side)."""
    n = int(rng.integers(1, 7))
    objs: list[dict] = []
    while len(objs) < n:
        kind, colour = kind_and_colour(rng, objs, KINDS, tuple(COLOURS), REPEAT)
        d = float(rng.uniform(*DIAMETER)) * side
        while (at := _place(rng, objs, d, side)) is None and d > 0.1 * side:
            d *= 0.85
        if at is None:  # no room left at all: start the scene again
            objs = []
            continue
        angle = float(rng.uniform(-1, 1)) * ROTATES[kind]
        objs.append(dict(kind=kind, color=colour, x=round(at[0], 2), y=round(at[1], 2), d=round(d, 2),
                         angle=round(angle, 1)))
    clutter = []
    if rng.random() < 0.5:
        for _ in range(int(rng.integers(1, 4))):
            clutter.append([round(float(v), 1) for v in rng.uniform(0, side, size=4)])  # x0, y0, x1, y1
    return dict(objects=objs, background=list(PALETTES)[rng.integers(len(PALETTES))],
                style=STYLES[rng.integers(len(STYLES))], clutter=clutter, texture_seed=int(rng.integers(2**31)))
