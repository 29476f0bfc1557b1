"""Drawing attention maps over the user's picture: pick a layer / head, undo the letterbox, colour the map.

    from vqa.heatmaps import attention_heatmap
    attention_heatmap("photo.jpg", result.attention[0], image_size=cfg.vit_image_size)   # a PIL image
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image

from .data.images import load_image
from .errors import InputError


def letterbox_box(width: int, height: int, size: int) -> tuple[float, float, float, float]:
    """Where a width x height image lies inside the size x size letterboxed model input
    (left, top, right, bottom in model-input pixels), as `ImageTransform.prepare` places it."""
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


def upsample_map(m: np.ndarray, width: int, height: int, image_size: int) -> np.ndarray:
    """A [grid, grid] map over the letterboxed `image_size` square, cropped to the picture's region and
    stretched (bilinear) onto a width x height picture: float32 [height, width]."""
    m = np.asarray(m, dtype=np.float32)
    cell = image_size / m.shape[-1]
    left, top, right, bottom = letterbox_box(width, height, image_size)
    box = (left / cell, top / cell, right / cell, bottom / cell)  # the picture's region in grid units
    up = Image.fromarray(m, mode="F").resize((width, height), Image.Resampling.BILINEAR, box=box)
    return np.asarray(up, dtype=np.float32)


def attention_heatmap(image: Any, maps, layer: int | None = None, head: int | None = None,
                      image_size: int | None = None, alpha: float = 0.6, colormap: str = "turbo") -> Image.Image:
    """`image` (as the user gave it) with an attention map laid over it, same size as the image.

    `maps` is [L, H, grid, grid] (averaged over layers and heads unless `layer` / `head` picks one, 0-based)
    or a single [grid, grid] map. The map covers the letterboxed square the model saw (`image_size` px, by
    default grid * 8 — pass the model's `vit_image_size` for exact placement); only the part over the picture
    is kept, stretched back onto it with bilinear interpolation. Values are scaled to 0..1 (min to max over
    the picture) before the colormap (turbo: dark red = most), so the picture shows where attention is
    relatively high; the overlay's opacity is `alpha` there and fades to a quarter of it where attention is
    lowest, so the picture stays visible."""
    import matplotlib

    img = image if isinstance(image, Image.Image) and image.mode == "RGB" else load_image(image)
    m = select_map(maps, layer, head)
    up = upsample_map(m, img.width, img.height, image_size or m.shape[-1] * 8)
    lo, hi = float(up.min()), float(up.max())
    up = (up - lo) / (hi - lo) if hi > lo else np.zeros_like(up)
    levels = np.clip(up * 255 + 0.5, 0, 255).astype(np.uint8)
    lut = (matplotlib.colormaps[colormap](np.linspace(0, 1, 256))[:, :3] * 255).astype(np.float32)
    opacity = float(alpha) * (0.25 + 0.75 * up)[..., None]  # low attention lets the picture show through
    mixed = np.asarray(img, dtype=np.float32) * (1 - opacity) + lut[levels] * opacity
    return Image.fromarray(np.clip(mixed + 0.5, 0, 255).astype(np.uint8), "RGB")


__all__ = ["attention_heatmap", "select_map", "letterbox_box", "upsample_map"]
