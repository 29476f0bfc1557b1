"""Glyphs scenes: what one holds and where the characters go.

1-4 characters: an uppercase letter (A-Z), a digit (0-9) or a symbol (&, ?, #), the kind drawn first (letters
half the time, digits 35%, symbols 15%, so that "more letters than digits?" has both answers), in one of 6
ink colours, a font size of 30-50% of the image side (capitals 21-35% tall), turned by up to 20 degrees either
way, in one of 3 styles (solid, bold, outlined). Half of the pictures set them on one line of text (centres
within a narrow band), the others anywhere. Their ink boxes never touch and stay 5% of the side clear of the
border. The page is paper, parchment, lined paper, graph paper, a grainy photo or a two-tone card. Spatial
relations reuse Shapes' rule (centres of the ink boxes apart by 10% of the side).
"""

from __future__ import annotations

import string

import numpy as np

from .generator import kind_and_colour
from .glyphs_font import K, bound

LETTERS, DIGITS = tuple(string.ascii_uppercase), tuple(string.digits)
SYMBOLS = {"&": "ampersand", "?": "question mark", "#": "hash"}  # the symbol's name: its answer and its word
KINDS = {"letter": LETTERS, "digit": DIGITS, "symbol": tuple(SYMBOLS)}
KIND_SHARE = (0.5, 0.35, 0.15)  # letter, digit, symbol
CHARS = LETTERS + DIGITS + tuple(SYMBOLS)
INKS = {
    "black": (24, 24, 30), "red": (205, 28, 34), "blue": (28, 62, 196), "green": (18, 128, 50),
    "purple": (118, 38, 156), "orange": (228, 112, 6),
}
PAGES = ("paper", "parchment", "lined paper", "graph paper", "grainy photo", "two-tone card")
STYLES = ("solid", "bold", "outlined")
FONT_SIZE = (0.30, 0.50)  # em as a fraction of the side (the font's capitals are 0.70 em tall)
MAX_TURN = 20.0  # degrees, either way
MAX_GLYPHS = 4
MIN_SIZE = 0.24  # a glyph shrinks to fit until its font size is at or under this fraction of the side
REPEAT = 0.3  # chance that a new glyph copies the character (and, separately, the ink) of an earlier one


def _place(rng: np.random.Generator, objs: list[dict], w: float, h: float, side: int) -> tuple[float, float] | None:
    """A centre for a w x h ink box clear of the border and of every other box (None: no room found)."""
    border, gap = max(3.0, 0.05 * side), max(2.0, 0.03 * side)
    if w > side - 2 * border or h > side - 2 * border:
        return None
    for _try in range(60):
        x = rng.uniform(border + w / 2, side - border - w / 2)
        y = rng.uniform(border + h / 2, side - border - h / 2)
        if all(abs(x - o["x"]) - (w + o["w"]) / 2 >= gap or abs(y - o["y"]) - (h + o["h"]) / 2 >= gap for o in objs):
            return float(x), float(y)
    return None


def _glyph(rng: np.random.Generator, objs: list[dict], side: int) -> dict:
    kind = list(KINDS)[int(np.searchsorted(np.cumsum(KIND_SHARE), rng.random(), side="right"))]
    char, ink = kind_and_colour(rng, objs, KINDS[kind], tuple(INKS), REPEAT, key="char")  # repeats: counts above one
    style, angle = STYLES[rng.integers(len(STYLES))], round(float(rng.uniform(-MAX_TURN, MAX_TURN)), 1)
    size = int(rng.uniform(*FONT_SIZE) * side * K)  # supersampled pixels: the font takes whole pixels
    kind = next(k for k, chars in KINDS.items() if char in chars)  # a copied character's own kind
    return dict(char=char, kind=kind, color=ink, style=style, size=size, angle=angle)


def _scatter(rng: np.random.Generator, n: int, side: int) -> list[dict]:
    """n glyphs anywhere; one that finds no room is tried again 15% smaller (down to MIN_SIZE), and a scene with
    no room left at all starts again."""
    objs: list[dict] = []
    while len(objs) < n:
        o = _glyph(rng, objs, side)
        while (at := _place(rng, objs, *bound(o["char"], o["size"], o["angle"], o["style"]), side)) is None \
                and o["size"] > MIN_SIZE * side * K:
            o["size"] = int(o["size"] * 0.85)
        if at is None:
            objs = []
            continue
        w, h = bound(o["char"], o["size"], o["angle"], o["style"])
        objs.append(dict(o, x=round(at[0], 2), y=round(at[1], 2), w=w, h=h))
    return objs


def _line(rng: np.random.Generator, n: int, side: int) -> list[dict] | None:
    """n glyphs on one line of text: all shrunk alike until they fit side by side, the spare room shared out
    at random between the gaps, each centre within 3% of the side of the line (None: too wide even at the
    smallest size)."""
    border, gap = max(3.0, 0.05 * side), max(2.0, 0.03 * side)
    objs: list[dict] = []
    for _ in range(n):
        objs.append(_glyph(rng, objs, side))
    while True:
        dims = [bound(o["char"], o["size"], o["angle"], o["style"]) for o in objs]
        spare = side - 2 * border - sum(w for w, _ in dims) - gap * (n - 1)
        if spare >= 0 or min(o["size"] for o in objs) <= MIN_SIZE * side * K:
            break
        for o in objs:
            o["size"] = int(o["size"] * 0.9)
    if spare < 0:
        return None
    cuts = np.sort(rng.uniform(0, spare, size=n))  # the room left of each glyph, cumulative
    line, left = float(rng.uniform(0.3, 0.7) * side), border
    for o, (w, h), extra in zip(objs, dims, np.diff(cuts, prepend=0.0), strict=True):
        left += float(extra)
        y = min(max(line + float(rng.normal(0, 0.03 * side)), border + h / 2), side - border - h / 2)
        o.update(x=round(left + w / 2, 2), y=round(y, 2), w=w, h=h)
        left += w + gap
    return objs


def make_scene(rng: np.random.Generator, side: int) -> dict:
    """1-4 glyphs on one line of text (half of the scenes) or anywhere, ink boxes apart, on a page."""
    n = int(rng.integers(1, MAX_GLYPHS + 1))
    objs = _line(rng, n, side) if rng.random() < 0.5 else None
    on_line = objs is not None
    if objs is None:
        objs = _scatter(rng, n, side)
    for o in objs:  # the boxes were the layout's; the drawn ink box comes from the glyph (object_box)
        del o["w"], o["h"]
    return dict(objects=objs, page=PAGES[rng.integers(len(PAGES))], line=on_line,
                texture_seed=int(rng.integers(2**31)))
