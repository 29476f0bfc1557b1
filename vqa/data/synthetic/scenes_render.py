"""Drawing a Scenes scene: a patterned background computed at 2x the image side (and doubled), thin scratches,
then every object as an outlined, rotated polygon (a ring as a thick circle) at 4x, and a 4x area reduction
that antialiases the pattern, the scratches and the objects alike."""

from __future__ import annotations

import functools
import math

import numpy as np
from PIL import Image, ImageDraw

from .scenes_layout import COLOURS, PALETTES

K = 4  # supersampling factor of the drawing
K_BACKGROUND = 2  # ... and of the background pattern (4x costs 4x the time and looks the same at 64 px)


@functools.lru_cache(maxsize=4)
def _grid(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Pixel centres as fractions of the side: y as a column, x as a row (they broadcast to [n, n])."""
    at = (np.arange(n, dtype=np.float32) + 0.5) / n
    return at[:, None], at[None, :]


def background(scene: dict, n: int) -> np.ndarray:
    """The [n, n, 3] uint8 background: a palette colour patterned by the scene's style."""
    rng = np.random.default_rng(scene["texture_seed"])
    yy, xx = _grid(n)
    style = scene["style"]
    if style == "checkerboard":
        cell = rng.uniform(0.08, 0.16)
        light = ((np.floor(xx / cell) + np.floor(yy / cell)) % 2) * 2 - 1
    elif style == "stripes":
        ang, period = rng.uniform(0, np.pi), rng.uniform(0.08, 0.18)
        light = (np.floor((np.cos(ang) * xx + np.sin(ang) * yy) / (period / 2)) % 2) * 2 - 1
    elif style == "blobs":
        light = np.zeros((n, n), np.float32)
        for _ in range(int(rng.integers(3, 6))):
            cx, cy, s = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.08, 0.2)
            sign = rng.choice((-1.6, 1.6))  # a Gaussian is separable: two 1-D bumps, one outer product
            light += (np.float32(sign) * np.exp(-((yy - cy) ** 2) / (2 * s * s))
                      * np.exp(-((xx - cx) ** 2) / (2 * s * s)))
    else:  # horizon: a paler sky over a darker floor that darkens towards the viewer
        h = rng.uniform(0.3, 0.6)
        light = np.broadcast_to(np.where(yy < h, 1.2, -0.6 - 0.8 * (yy - h) / (1 - h)), (n, n))
    tone = np.asarray(PALETTES[scene["background"]], np.float32) + rng.uniform(-8, 8, size=3).astype(np.float32)
    return np.clip(tone + np.float32(14) * light[..., None].astype(np.float32), 0, 255).astype(np.uint8)


def _turn(points: list[tuple[float, float]], cx: float, cy: float, r: float, angle: float) -> list[tuple[float, float]]:
    """Unit-radius points, turned by `angle` degrees, scaled by r and moved to (cx, cy)."""
    c, s = math.cos(math.radians(angle)), math.sin(math.radians(angle))
    return [(cx + r * (c * x - s * y), cy + r * (s * x + c * y)) for x, y in points]


def _heart() -> list[tuple[float, float]]:
    out = []
    for i in range(48):
        t = 2 * math.pi * i / 48
        x = 16 * math.sin(t) ** 3
        y = 13 * math.cos(t) - 5 * math.cos(2 * t) - 2 * math.cos(3 * t) - math.cos(4 * t)
        out.append((x / 16.5, -(y + 2.5) / 16.5))  # y ranges -17..12: centred, image y points down
    return out


OUTLINES = {
    "star": [((1.0 if i % 2 == 0 else 0.45) * math.cos(math.pi * (i / 5 - 0.5)),
              (1.0 if i % 2 == 0 else 0.45) * math.sin(math.pi * (i / 5 - 0.5))) for i in range(10)],
    "heart": _heart(),
    "cross": [
        (0.3, -1), (0.3, -0.3), (1, -0.3), (1, 0.3), (0.3, 0.3), (0.3, 1),
        (-0.3, 1), (-0.3, 0.3), (-1, 0.3), (-1, -0.3), (-0.3, -0.3), (-0.3, -1)],
    "hexagon": [(math.cos(math.pi * i / 3), math.sin(math.pi * i / 3)) for i in range(6)],
    "arrow": [(1, 0), (-0.1, 0.65), (-0.1, 0.3), (-1, 0.3), (-1, -0.3), (-0.1, -0.3), (-0.1, -0.65)],
}


def _edge(fill: tuple[int, int, int]) -> tuple[int, int, int]:
    """The outline colour: a darker shade of the fill (a mid grey around black)."""
    return (110, 110, 110) if max(fill) < 60 else tuple(int(0.55 * v) for v in fill)


def render(scene: dict, side: int) -> Image.Image:
    """The scene as an RGB image of `side` x `side` pixels."""
    n = side * K
    img = Image.fromarray(background(scene, side * K_BACKGROUND), "RGB").resize((n, n), Image.Resampling.NEAREST)
    draw = ImageDraw.Draw(img)
    tone = np.asarray(PALETTES[scene["background"]])
    scratch = tuple(int(v) for v in np.clip(tone - 45, 0, 255))
    for x0, y0, x1, y1 in scene["clutter"]:
        draw.line((x0 * K, y0 * K, x1 * K, y1 * K), fill=scratch, width=K)
    for o in scene["objects"]:
        cx, cy, r = o["x"] * K, o["y"] * K, o["d"] * K / 2
        fill = COLOURS[o["color"]]
        edge, w = _edge(fill), max(2, round(0.12 * r))
        if o["kind"] == "ring":
            draw.ellipse((cx - r, cy - r, cx + r, cy + r), outline=edge, width=round(0.5 * r))
            r_in = r - w
            draw.ellipse((cx - r_in, cy - r_in, cx + r_in, cy + r_in), outline=fill, width=round(0.5 * r) - 2 * w)
        else:
            draw.polygon(_turn(OUTLINES[o["kind"]], cx, cy, r, o["angle"]), fill=fill, outline=edge, width=w)
    return img.reduce(K)


def object_box(o: dict, outlines: dict[str, list[tuple[float, float]]] = OUTLINES) -> list[float]:
    """The object's box [left, top, right, bottom] in pixels: its turned outline's extent (a kind without an
    outline, a ring or a circle: its circle)."""
    r = o["d"] / 2
    if o["kind"] in outlines:
        pts = _turn(outlines[o["kind"]], o["x"], o["y"], r, o["angle"])
    else:
        pts = [(o["x"] - r, o["y"] - r), (o["x"] + r, o["y"] + r)]
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    return [round(min(xs), 2), round(min(ys), 2), round(max(xs), 2), round(max(ys), 2)]
