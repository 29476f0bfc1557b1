"""Shapes scenes: what one holds (1-6 objects: 4 shapes, 6 colours, 2 sizes, on one of 3 grey levels x plain /
gradient / noise) and where the objects go (random non-overlapping positions)."""

from __future__ import annotations

import numpy as np

SHAPES = ("circle", "square", "triangle", "diamond")
COLORS = {
    "red": (220, 40, 40), "orange": (245, 140, 20), "yellow": (240, 215, 40),
    "green": (40, 170, 70), "blue": (40, 90, 230), "purple": (150, 60, 200),
}
SIZES = {"small": 0.14, "large": 0.25}  # bounding-box side as a fraction of the image side (9 / 16 px at 64)
BACKGROUNDS = {"light gray": 196, "gray": 128, "dark gray": 56}
STYLES = ("plain", "gradient", "noise")
REPEAT = 0.3  # chance that a new object copies the shape (and, separately, the colour) of an earlier one


def make_scene(rng: np.random.Generator, side: int) -> dict:
    """Random objects with non-overlapping boxes, kept at least 5% of the side away from the border."""
    border, gap = max(3.0, 0.05 * side), max(2.0, 0.03 * side)
    n = int(rng.integers(1, 7))
    while True:
        objs: list[dict] = []
        for _ in range(n):
            shape, color = SHAPES[rng.integers(len(SHAPES))], list(COLORS)[rng.integers(len(COLORS))]
            size = ("small", "large")[rng.integers(2)]
            if objs and rng.random() < REPEAT:  # repeat a shape or colour now and then: larger counts
                shape = objs[rng.integers(len(objs))]["shape"]
            if objs and rng.random() < REPEAT:
                color = objs[rng.integers(len(objs))]["color"]
            d = round(SIZES[size] * side)
            for _try in range(100):
                x, y = rng.uniform(border + d / 2, side - border - d / 2, size=2)
                if all(max(abs(x - o["x"]) - (d + o["d"]) / 2, abs(y - o["y"]) - (d + o["d"]) / 2) >= gap
                       for o in objs):
                    objs.append(dict(shape=shape, color=color, size=size,
                                     x=round(float(x), 2), y=round(float(y), 2), d=d))
                    break
        if len(objs) == n:
            break
    bg = list(BACKGROUNDS)[rng.integers(len(BACKGROUNDS))]
    return dict(objects=objs, background=bg, style=STYLES[rng.integers(len(STYLES))],
                texture_seed=int(rng.integers(2**31)))
