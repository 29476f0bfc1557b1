"""Drawing a Shapes scene: the background texture, then the shapes drawn 4x supersampled and area-downsampled."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from .shapes_layout import BACKGROUNDS, COLORS

SUPERSAMPLE = 4


def render(scene: dict, side: int) -> Image.Image:
    """The scene as an RGB image: background texture, then shapes drawn 4x larger and area-downsampled
    (antialiased edges, no ringing; the background texture comes back unchanged)."""
    rng = np.random.default_rng(scene["texture_seed"])
    base = float(BACKGROUNDS[scene["background"]])
    bg = np.full((side, side), base, np.float32)
    if scene["style"] == "gradient":
        ang = rng.uniform(0, 2 * np.pi)
        yy, xx = np.mgrid[0:side, 0:side] / side - 0.5
        bg += 40 * (np.cos(ang) * xx + np.sin(ang) * yy)
    elif scene["style"] == "noise":
        bg += rng.normal(0, 7, size=(side, side))
    tint = rng.uniform(-6, 6, size=3).astype(np.float32)
    arr = np.clip(bg[..., None] + tint, 0, 255).astype(np.uint8)
    k = SUPERSAMPLE
    img = Image.fromarray(arr, "RGB").resize((side * k, side * k), Image.Resampling.NEAREST)
    draw = ImageDraw.Draw(img)
    for o in scene["objects"]:
        cx, cy, h = o["x"] * k, o["y"] * k, o["d"] * k / 2
        fill = COLORS[o["color"]]
        if o["shape"] == "circle":
            draw.ellipse((cx - h, cy - h, cx + h, cy + h), fill=fill)
        elif o["shape"] == "square":
            draw.rectangle((cx - h, cy - h, cx + h, cy + h), fill=fill)
        elif o["shape"] == "triangle":
            draw.polygon([(cx, cy - h), (cx + h, cy + h), (cx - h, cy + h)], fill=fill)
        else:
            draw.polygon([(cx, cy - h), (cx + h, cy), (cx, cy + h), (cx - h, cy)], fill=fill)
    return img.reduce(k)  # area average of each k x k block: the exact supersampling resolve, far cheaper than LANCZOS


def object_box(o: dict) -> list[float]:
    """The object's box [left, top, right, bottom] in pixels: every shape fills the d x d square at its centre."""
    h = o["d"] / 2
    return [round(o["x"] - h, 2), round(o["y"] - h, 2), round(o["x"] + h, 2), round(o["y"] + h, 2)]
