"""A picture's preprocessing: one value (`Preprocess`) that defines it and one function (`model_input`) that
turns a picture into a model's input.

`Preprocess.from_config(cfg)` holds every setting that decides the pixels a model gets: the side, the resize
(letterbox or squash), the resample filter, the padding colour, the normalisation mean and std and the pixel
limit. `model_input(src, pre)` turns a path, encoded bytes (a shard's KEY.jpg), a PIL image or an array into
the uint8 [3, S, S] input: training (the data set, the shard stream, the image cache), `vqa eval`, the
Predictor (`vqa ask` / `vqa caption`, the demo), collections and the ONNX runtime all call it, so a picture
gives the same pixels everywhere. Training's augmentation (shift, flip, jitter) is applied after it, in
training only. `pre.key()` is the whole value as text: the image cache's fingerprint and the Predictor's
encoding keys include it.

JPEG draft decoding: an encoded JPEG is decoded at the smallest DCT scale (1/2, 1/4, 1/8; PIL's `draft`) that
still leaves every side the resize reads at least its target (letterbox: the aspect-kept size whose longer side
is S; squash: S on both sides), so the resize only ever shrinks. Every caller decodes a file the same way; a
picture handed over already decoded (a PIL image, an array) is resized from its full size.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
from PIL import Image

from . import images

DRAFT_RULE = 2  # of the JPEG draft decoding above: part of `key()`, so a cache made by another rule is not read


@dataclass(frozen=True)
class Preprocess:
    """Every setting that decides a model's input pixels (ModelConfig's vit_* fields) and the pixel limit
    (None: `vqa.data.images.MAX_PIXELS` when a picture is read)."""

    size: int
    resize: str = "letterbox"  # ModelConfig.vit_resize: "letterbox" (aspect kept, padded) or "squash"
    resample: str = "bicubic"  # ModelConfig.vit_resample
    fill: tuple[int, int, int] = (0, 0, 0)  # the letterbox padding: the mean colour, 0 after normalisation
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    max_pixels: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", int(self.size))
        object.__setattr__(self, "fill", tuple(int(f) for f in self.fill))
        object.__setattr__(self, "mean", tuple(float(m) for m in self.mean))
        object.__setattr__(self, "std", tuple(float(s) for s in self.std))

    @classmethod
    def of(cls, size: int, mean: Sequence[float], std: Sequence[float], resize: str = "letterbox",
           resample: str = "bicubic", max_pixels: int | None = None) -> Preprocess:
        """The preprocessing of an encoder with this side and normalisation; the padding is the mean colour."""
        return cls(size, resize, resample, tuple(round(m * 255) for m in mean), tuple(mean), tuple(std), max_pixels)

    @classmethod
    def from_config(cls, cfg, max_pixels: int | None = None) -> Preprocess:
        """The preprocessing a ModelConfig's encoder was built for."""
        return cls.of(cfg.vit_image_size, cfg.vit_mean, cfg.vit_std, cfg.vit_resize, cfg.vit_resample, max_pixels)

    def with_limit(self, max_pixels: int | None) -> Preprocess:
        return self if max_pixels == self.max_pixels else replace(self, max_pixels=max_pixels)

    def key(self) -> str:
        """The whole value (and the draft rule) as stable text, for caches and keys derived from pixels."""
        return json.dumps(dict(asdict(self), draft_rule=DRAFT_RULE), sort_keys=True)


def draft_target(size: tuple[int, int], pre: Preprocess) -> tuple[int, int]:
    """The smallest decoded (width, height) from which `pre`'s resize still only shrinks."""
    if pre.resize == "squash":
        return pre.size, pre.size
    w, h = size
    m = max(w, h)
    return max(1, math.ceil(pre.size * w / m)), max(1, math.ceil(pre.size * h / m))


def model_picture(src: Any, pre: Preprocess, name: str | None = None) -> Image.Image:
    """The S x S RGB picture the model reads (before normalisation), from any `load_image` input; torch-free,
    so the ONNX runtime uses it too. Raises InputError for a missing, unreadable or over-large picture."""
    img = images.load_image(src, max_pixels=pre.max_pixels, name=name, draft=lambda wh: draft_target(wh, pre))
    return images.fit(img, pre.size, pre.fill, pre.resize, pre.resample)


def model_input(src: Any, pre: Preprocess, name: str | None = None):
    """uint8 tensor [3, S, S]: `model_picture` as the model takes it (HWC -> CHW)."""
    import torch

    return torch.from_numpy(np.asarray(model_picture(src, pre, name)).transpose(2, 0, 1).copy())


__all__ = ["Preprocess", "model_input", "model_picture", "draft_target"]
