"""Drawing a pretraining-corpus scene: a patterned background, then each object in list order (later ones in
front) as a mask drawn at 4x, filled solid, hollow or with a texture, in the scene's drawing style, and a 4x
area reduction that antialiases everything."""

from __future__ import annotations

import math
from functools import partial

import numpy as np
from PIL import Image, ImageDraw

from ...errors import DataError
from .corpus_layout import BACKGROUNDS, COLOURS
from .scenes_render import OUTLINES, _grid, _turn
from .scenes_render import object_box as outline_box

K = 4  # supersampling factor


def _regular(n: int, start: float = -90.0) -> list[tuple[float, float]]:
    return [(math.cos(math.radians(start + 360 * i / n)), math.sin(math.radians(start + 360 * i / n)))
            for i in range(n)]


SHAPES = {
    **OUTLINES,
    "triangle": _regular(3), "square": _regular(4, 45.0), "diamond": [(0, -1), (0.7, 0), (0, 1), (-0.7, 0)],
    "pentagon": _regular(5), "octagon": _regular(8, 22.5),
}
object_box = partial(outline_box, outlines=SHAPES)  # a circle or a ring: its circle


def background(scene: dict, n: int) -> np.ndarray:
    """The [n, n, 3] float32 background: the scene's colour in its pattern."""
    rng = np.random.default_rng(scene["texture_seed"])
    yy, xx = _grid(n)
    pattern = scene["pattern"]
    light = np.zeros((n, n), np.float32)
    if pattern == "gradient":
        ang = rng.uniform(0, 2 * np.pi)
        light = light + 1.6 * (np.cos(ang) * (xx - 0.5) + np.sin(ang) * (yy - 0.5))
    elif pattern == "grid":
        cell = rng.uniform(0.1, 0.2)
        light = light + np.where((xx % cell < 0.02) | (yy % cell < 0.02), -1.2, 0.0)
    elif pattern == "dots":
        cell = rng.uniform(0.08, 0.14)
        light = light + np.where(np.hypot(xx % cell - cell / 2, yy % cell - cell / 2) < cell / 5, 1.0, 0.0)
    elif pattern == "waves":
        period = rng.uniform(0.1, 0.25)
        light = light + 0.8 * np.sin(2 * np.pi * (yy + 0.05 * np.sin(2 * np.pi * xx / 0.3)) / period)
    elif pattern == "noise":
        light = light + rng.normal(0, 0.4, size=(n, n)).astype(np.float32)
    tone = np.asarray(BACKGROUNDS[scene["background"]], np.float32) + rng.uniform(-8, 8, size=3).astype(np.float32)
    return tone + np.float32(18) * light[..., None]


def object_mask(o: dict, n: int, scale: float, grow: float = 0.0) -> np.ndarray:
    """The [n, n] bool mask of object o drawn at `scale` pixels per scene unit; `grow` widens it by that many
    pixels all round (the outline of the ink style, the shadow)."""
    img = Image.new("L", (n, n), 0)
    draw = ImageDraw.Draw(img)
    cx, cy, r = o["x"] * scale, o["y"] * scale, o["d"] * scale / 2
    w = round(grow)
    if o["kind"] in ("circle", "ring"):
        draw.ellipse((cx - r - w, cy - r - w, cx + r + w, cy + r + w), fill=255)
        if o["kind"] == "ring":
            r_in = 0.55 * r - w
            draw.ellipse((cx - r_in, cy - r_in, cx + r_in, cy + r_in), fill=0)
    else:
        draw.polygon(_turn(SHAPES[o["kind"]], cx, cy, r, o["angle"]), fill=255, outline=255 if w else None,
                     width=max(1, 2 * w))
    return np.asarray(img) > 127


def _texture(o: dict, n: int, rng: np.random.Generator) -> np.ndarray:
    """[n, n] bool: where a textured fill shows the object's colour (elsewhere a paler tint of it)."""
    yy, xx = _grid(n)
    cell = rng.uniform(0.035, 0.06)
    if o["fill"] == "striped":
        ang = math.radians(o["angle"])
        return ((math.cos(ang) * xx + math.sin(ang) * yy) % cell) < cell / 2
    if o["fill"] == "dotted":
        return np.hypot(xx % cell - cell / 2, yy % cell - cell / 2) >= cell / 3.2
    return ((xx // (cell / 1.4) + yy // (cell / 1.4)) % 2) == 0  # checked


def render(scene: dict, side: int) -> Image.Image:
    """The scene as an RGB image of `side` x `side` pixels."""
    if scene.get("style") == "picture":
        raise DataError(f"corpus picture {scene.get('file_name')} is a things scene: it is drawn from the things "
                        "folder it was built with (vqa.data.synthetic.corpus_things.with_things)")
    n = side * K
    img = background(scene, n)
    rng = np.random.default_rng([scene["texture_seed"], 1])
    style = scene["style"]
    for o in scene["objects"]:
        colour = np.asarray(COLOURS[o["color"]], np.float32)
        edge_w = max(2.0, 0.08 * o["d"] * K)
        if style == "shadow":
            shifted = dict(o, x=o["x"] + 0.04 * o["d"] + 0.5, y=o["y"] + 0.04 * o["d"] + 0.5)
            img[object_mask(shifted, n, K)] *= 0.55
        if style == "ink":
            img[object_mask(o, n, K, grow=edge_w / 2)] = (15, 15, 15)
        mask = object_mask(o, n, K)
        if o["fill"] == "hollow":
            inner = object_mask(dict(o, d=max(0.0, o["d"] - 2.4 * edge_w / K)), n, K)
            img[mask & ~inner] = colour
        else:
            img[mask] = colour
            if o["fill"] != "solid":
                pale = mask & ~_texture(o, n, rng)
                img[pale] = 0.45 * colour + 0.55 * np.float32(255 if colour.mean() < 200 else 120)
        if style == "outlined" and o["fill"] != "hollow":
            inner = object_mask(dict(o, d=max(0.0, o["d"] - 1.6 * edge_w / K)), n, K)
            img[mask & ~inner] = 0.5 * colour
    arr = np.clip(img, 0, 255).astype(np.uint8)
    return Image.fromarray(arr, "RGB").reduce(K)
