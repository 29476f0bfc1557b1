"""Drawing a Glyphs scene: the page computed at 2x the picture side (and doubled), then every glyph's ink and
fill masks (`glyphs_font`, Pillow's built-in font at 4x) blended on in its colour (an outlined glyph has a
dark rim, a black one a white rim), and a 4x area reduction that antialiases page and glyphs alike."""

from __future__ import annotations

import numpy as np
from PIL import Image

from .glyphs_font import K, corner, glyph, object_box
from .glyphs_layout import INKS
from .scenes_render import _grid

K_PAGE = 2  # the page's own resolution (4x costs 4x the time and looks the same at 64 px)
PAPER = {"paper": (240, 236, 226), "parchment": (222, 202, 154), "lined paper": (246, 246, 240),
         "graph paper": (238, 244, 238), "grainy photo": (190, 186, 176), "two-tone card": (226, 226, 226)}
CARDS = ((236, 214, 214), (208, 224, 240), (222, 236, 206), (244, 232, 190), (226, 214, 236))  # two-tone pairs


def _smooth_noise(rng: np.random.Generator, n: int, cells: int) -> np.ndarray:
    """[n, n, 3] noise in -1..1, smooth over n / cells pixels: a coarse random grid, bilinearly enlarged."""
    coarse = rng.uniform(-1, 1, size=(cells + 1, cells + 1, 3)).astype(np.float32)
    return np.stack([np.asarray(Image.fromarray(coarse[..., c], "F").resize((n, n), Image.Resampling.BILINEAR))
                     for c in range(3)], axis=-1)


def page(scene: dict, n: int) -> np.ndarray:
    """The [n, n, 3] float32 page of the scene's kind, its texture drawn from the scene's texture seed."""
    rng = np.random.default_rng(scene["texture_seed"])
    yy, xx = _grid(n)
    kind = scene["page"]
    base = np.asarray(PAPER[kind], np.float32) + rng.uniform(-6, 6, size=3).astype(np.float32)
    out = np.broadcast_to(base, (n, n, 3)).copy()
    if kind == "paper":  # fine grain and a faint fold shadow
        out += rng.normal(0, 3, size=(n, n, 1)).astype(np.float32)
        out -= 10 * np.exp(-((xx - rng.uniform(0.2, 0.8)) ** 2) / 0.004)[..., None]
    elif kind == "parchment":  # stains and darker edges
        out += 14 * _smooth_noise(rng, n, 4).mean(-1, keepdims=True)
        out -= 60 * ((xx - 0.5) ** 2 + (yy - 0.5) ** 2)[..., None]
    elif kind == "lined paper":  # pale blue rules and, most of the time, a red margin
        gap, first = rng.uniform(0.11, 0.16), rng.uniform(0.0, 0.1)
        rule = (((yy - first) % gap) < 0.018) & np.ones_like(xx, bool)
        out[rule] = (150, 190, 226)
        if rng.random() < 0.7:
            out[(np.abs(xx - rng.uniform(0.08, 0.2)) < 0.01) & np.ones_like(yy, bool)] = (226, 140, 140)
    elif kind == "graph paper":
        cell = rng.uniform(0.06, 0.1)
        out[((xx % cell) < 0.012) | ((yy % cell) < 0.012)] = (170, 206, 180)
    elif kind == "grainy photo":  # soft coloured shapes of light, then sensor noise
        out += 34 * _smooth_noise(rng, n, int(rng.integers(2, 5))) + rng.normal(0, 6, size=(n, n, 3)).astype(np.float32)
    else:  # two-tone card: two pale tones split by a straight edge
        a, b = rng.choice(len(CARDS), size=2, replace=False)
        ang, at = rng.uniform(0, 2 * np.pi), rng.uniform(-0.2, 0.2)
        side = (np.cos(ang) * (xx - 0.5) + np.sin(ang) * (yy - 0.5)) < at
        out[:] = np.where(side[..., None], np.float32(CARDS[a]), np.float32(CARDS[b]))
    return out


def rim(color: str) -> tuple[int, int, int]:
    """An outlined glyph's rim: white around black ink, else a dark shade of the ink."""
    fill = INKS[color]
    return (250, 250, 250) if color == "black" else tuple(int(0.35 * v) for v in fill)


def render(scene: dict, side: int) -> Image.Image:
    """The scene as an RGB image of `side` x `side` pixels."""
    n = side * K
    small = np.clip(page(scene, side * K_PAGE), 0, 255).astype(np.uint8)
    arr = np.asarray(Image.fromarray(small, "RGB").resize((n, n), Image.Resampling.NEAREST), np.float32).copy()
    for o in scene["objects"]:
        ink, fill = glyph(o["char"], o["size"], o["angle"], o["style"])
        left, top = corner(o)
        h, w = ink.shape
        region = arr[top : top + h, left : left + w]  # [h, w, 3], a view: blended in place
        a_ink, a_fill = ink[..., None] / np.float32(255), fill[..., None] / np.float32(255)
        edge = rim(o["color"]) if o["style"] == "outlined" else INKS[o["color"]]
        region += (np.float32(edge) - region) * a_ink
        region += (np.float32(INKS[o["color"]]) - region) * a_fill
    img = Image.fromarray(np.clip(np.rint(arr), 0, 255).astype(np.uint8), "RGB")
    return img.reduce(K)


__all__ = ["object_box", "page", "render"]
