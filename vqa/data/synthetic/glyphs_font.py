"""One Glyphs character as ink: Pillow's built-in FreeType font (`ImageFont.load_default(size=N)`, Aileron
Regular, inside Pillow since 10.1: no system font is read, so every machine draws the same pixels), drawn
at 4x, optionally stroked (outlined or bold), turned, and cropped to its ink.

The layout keeps glyphs apart by a bound computed without drawing (`bound`: the turned box of the upright
ink); the renderer pastes the masks of one cached `glyph` call and `object_box` is their exact extent, so
a box always holds its glyph's ink and lies inside the bound the layout kept clear."""

from __future__ import annotations

import functools
import math

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from ...errors import ConfigError

K = 4  # supersampling factor: a glyph is drawn at K x its pixel size and the picture is area-reduced by K
STROKE = {"solid": 0.0, "bold": 0.035, "outlined": 0.06}  # stroke width as a fraction of the font size


@functools.lru_cache(maxsize=256)
def font(size: int) -> ImageFont.FreeTypeFont:
    """Pillow's built-in font at `size` pixels (em); a clear error where Pillow cannot scale it."""
    try:
        f = ImageFont.load_default(size=size)
    except (TypeError, ImportError, OSError) as e:
        raise ConfigError(f"Glyphs needs Pillow >= 10.1 built with FreeType (its built-in scalable font): {e}") from e
    if not isinstance(f, ImageFont.FreeTypeFont):
        raise ConfigError("Glyphs needs Pillow >= 10.1 built with FreeType (its built-in scalable font)")
    return f


@functools.lru_cache(maxsize=8192)
def glyph(char: str, size: int, angle: float, style: str) -> tuple[np.ndarray, np.ndarray]:
    """(ink, fill): two uint8 [h, w] masks of `char` at font size `size` (supersampled pixels), turned by
    `angle` degrees counter-clockwise and cropped to the ink. Ink is the fill plus its stroke (`style`)."""
    f, stroke = font(size), round(STROKE[style] * size)
    left, top, right, bottom = f.getbbox(char, stroke_width=stroke)
    pad = 1  # the bilinear turn spreads ink by up to 1 pixel
    w, h = right - left + 2 * pad, bottom - top + 2 * pad
    at = (pad - left, pad - top)
    masks = []
    for width in (stroke, 0) if stroke else (0,):  # ink, then fill (one mask when the style has no stroke)
        m = Image.new("L", (w, h), 0)
        ImageDraw.Draw(m).text(at, char, font=f, fill=255, stroke_width=width, stroke_fill=255)
        masks.append(m.rotate(angle, resample=Image.Resampling.BILINEAR, expand=True) if angle else m)
    box = masks[0].getbbox()
    if box is None:
        raise ConfigError(f"Pillow's built-in font draws nothing for {char!r}")
    ink, fill = (np.asarray(m.crop(box)) for m in (masks[0], masks[-1]))
    return ink, fill


def bound(char: str, size: int, angle: float, style: str) -> tuple[float, float]:
    """(width, height) in picture pixels of a box that holds the turned glyph's ink (the turned box of the
    upright ink, plus the turn's spread): what the layout keeps apart, without drawing the glyph."""
    left, top, right, bottom = font(size).getbbox(char, stroke_width=round(STROKE[style] * size))
    c, s = abs(math.cos(math.radians(angle))), abs(math.sin(math.radians(angle)))
    w, h = right - left, bottom - top
    return (w * c + h * s + 2) / K, (w * s + h * c + 2) / K


def corner(o: dict) -> tuple[int, int]:
    """(left, top) of glyph o's ink in supersampled pixels: its centre (o["x"], o["y"]) rounded to the grid."""
    h, w = glyph(o["char"], o["size"], o["angle"], o["style"])[0].shape
    return round(o["x"] * K - w / 2), round(o["y"] * K - h / 2)


def object_box(o: dict) -> list[float]:
    """Glyph o's box [left, top, right, bottom] in picture pixels: exactly its ink's extent."""
    h, w = glyph(o["char"], o["size"], o["angle"], o["style"])[0].shape
    left, top = corner(o)
    return [left / K, top / K, (left + w) / K, (top + h) / K]
