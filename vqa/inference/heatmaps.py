"""Drawing attention maps over the user's picture: pick a layer / head, undo the letterbox, colour the map.

    from vqa.inference.heatmaps import attention_heatmap
    attention_heatmap("photo.jpg", result.attention[0], image_size=cfg.vit_image_size)   # a PIL image
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
from PIL import Image

from ..data.images import load_image
from ..errors import InputError


def letterbox_box(width: int, height: int, size: int, resize: str = "letterbox") -> tuple[float, float, float, float]:
    """Where a width x height image lies inside the size x size letterboxed model input
    (left, top, right, bottom in model-input pixels), as `ImageTransform.prepare` places it; with
    resize="squash" (ModelConfig.vit_resize, an imported model's) the whole square."""
    if resize == "squash":
        return 0.0, 0.0, float(size), float(size)
    scale = size / max(width, height)
    nw, nh = max(1, round(width * scale)), max(1, round(height * scale))
    left, top = (size - nw) // 2, (size - nh) // 2
    return float(left), float(top), float(left + nw), float(top + nh)


def select_map(maps: torch.Tensor | np.ndarray, layer: int | None = None, head: int | None = None) -> np.ndarray:
    """One [grid, grid] map from [L, H, grid, grid] (or [grid, grid]): the given layer / head (0-based),
    averaged over the others."""
    m = torch.as_tensor(np.asarray(maps) if not torch.is_tensor(maps) else maps).float()
    if m.ndim == 2:
        return m.numpy()
    if m.ndim != 4:
        raise InputError(f"attention maps must be [layers, heads, grid, grid] or [grid, grid], got {tuple(m.shape)}")
    for name, i, n in (("layer", layer, m.shape[0]), ("head", head, m.shape[1])):
        if i is not None and not 0 <= int(i) < n:
            raise InputError(f"{name} {i} does not exist: the model has {n} (0-based)")
    m = m[int(layer)][None] if layer is not None else m
    m = m[:, int(head)][:, None] if head is not None else m
    return m.mean((0, 1)).numpy()


def upsample_map(m: np.ndarray, width: int, height: int, image_size: int, resize: str = "letterbox") -> np.ndarray:
    """A [grid, grid] map over the letterboxed `image_size` square, cropped to the picture's region and
    stretched (bilinear) onto a width x height picture: float32 [height, width]."""
    m = np.asarray(m, dtype=np.float32)
    cell = image_size / m.shape[-1]
    left, top, right, bottom = letterbox_box(width, height, image_size, resize)
    box = (left / cell, top / cell, right / cell, bottom / cell)  # the picture's region in grid units
    up = Image.fromarray(m, mode="F").resize((width, height), Image.Resampling.BILINEAR, box=box)
    return np.asarray(up, dtype=np.float32)


def attention_heatmap(image: Any, maps, layer: int | None = None, head: int | None = None,
                      image_size: int | None = None, alpha: float = 0.6, colormap: str = "turbo",
                      resize: str = "letterbox") -> Image.Image:
    """`image` (as the user gave it) with an attention map laid over it, same size as the image.

    `maps` is [L, H, grid, grid] (averaged over layers and heads unless `layer` / `head` picks one, 0-based)
    or a single [grid, grid] map over the letterboxed square the model saw (`image_size` px, by default
    grid * 8: pass the model's `vit_image_size` and `resize` for exact placement); the part over the picture is
    stretched back onto it. The colours show where attention is relatively high (min to max over the picture,
    turbo: dark red = most); the overlay's opacity `alpha` fades to a quarter of it where attention is lowest."""
    img = image if isinstance(image, Image.Image) and image.mode == "RGB" else load_image(image)
    m = select_map(maps, layer, head)
    up = upsample_map(m, img.width, img.height, image_size or m.shape[-1] * 8, resize)
    lo, hi = float(up.min()), float(up.max())
    up = (up - lo) / (hi - lo) if hi > lo else np.zeros_like(up)
    levels = np.clip(up * 255 + 0.5, 0, 255).astype(np.uint8)
    lut = _lut(colormap)
    opacity = float(alpha) * (0.25 + 0.75 * up)[..., None]  # low attention lets the picture show through
    mixed = np.asarray(img, dtype=np.float32) * (1 - opacity) + lut[levels] * opacity
    return Image.fromarray(np.clip(mixed + 0.5, 0, 255).astype(np.uint8), "RGB")


@functools.lru_cache(maxsize=8)
def _lut(colormap: str) -> np.ndarray:
    """The colormap as a [256, 3] float32 table (built once per name: matplotlib's lookup costs a few ms)."""
    import matplotlib  # imported when drawn: the CLI starts without it

    return (matplotlib.colormaps[colormap](np.linspace(0, 1, 256))[:, :3] * 255).astype(np.float32)


def patch_edges(width: int, height: int, grid: int, image_size: int,
                resize: str = "letterbox") -> tuple[list[float], list[float]]:
    """Where the patch borders fall on a width x height picture (x positions, y positions, in its pixels):
    the model's grid x grid patches cover the letterboxed `image_size` square, so the borders are mapped
    back through the letterbox; borders over the padding are left out."""
    left, top, right, bottom = letterbox_box(width, height, image_size, resize)
    cell = image_size / grid
    xs = [(i * cell - left) * width / (right - left) for i in range(grid + 1)]
    ys = [(i * cell - top) * height / (bottom - top) for i in range(grid + 1)]
    return [x for x in xs if -0.5 <= x <= width + 0.5], [y for y in ys if -0.5 <= y <= height + 0.5]


def patch_box(width: int, height: int, row: int, col: int, grid: int, image_size: int,
              resize: str = "letterbox") -> tuple[float, ...]:
    """The picture-pixel box (left, top, right, bottom) of patch (row, col), clipped to the picture."""
    left, top, right, bottom = letterbox_box(width, height, image_size, resize)
    cell = image_size / grid
    sx, sy = width / (right - left), height / (bottom - top)
    box = ((col * cell - left) * sx, (row * cell - top) * sy, ((col + 1) * cell - left) * sx,
           ((row + 1) * cell - top) * sy)
    return max(0.0, box[0]), max(0.0, box[1]), min(float(width), box[2]), min(float(height), box[3])


def draw_patch_grid(img: Image.Image, grid: int, image_size: int, color=(255, 255, 255, 90),
                    mark: tuple[int, int] | None = None, mark_color=(255, 255, 255),
                    resize: str = "letterbox") -> Image.Image:
    """A copy of `img` with the model's patch borders drawn (thin, translucent) and, optionally, patch
    `mark` = (row, column) outlined."""
    from PIL import ImageDraw

    out = img.convert("RGBA")
    layer = Image.new("RGBA", out.size, (0, 0, 0, 0))
    d = ImageDraw.Draw(layer)
    xs, ys = patch_edges(out.width, out.height, grid, image_size, resize)
    for x in xs:
        d.line([(x, 0), (x, out.height)], fill=color, width=1)
    for y in ys:
        d.line([(0, y), (out.width, y)], fill=color, width=1)
    if mark is not None:
        d.rectangle(patch_box(out.width, out.height, *mark, grid, image_size, resize), outline=mark_color,
                    width=max(2, out.width // 120))
    return Image.alpha_composite(out, layer).convert("RGB")


__all__ = ["attention_heatmap", "select_map", "letterbox_box", "upsample_map", "patch_edges", "patch_box",
           "draw_patch_grid"]
