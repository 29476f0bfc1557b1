"""Image transforms (torchvision v2): letterbox to the model's square input, light augmentation, normalization.

Aspect ratio: images are *letterboxed*: the longer side is resized to S keeping the aspect ratio, and the
shorter side is padded (equally on both sides) to S with the encoder's mean colour, which becomes 0 after
normalization. Nothing is cropped, so no object or text-relevant region is ever cut away.

Augmentation (train only) is deliberately mild so it never changes a question's answer: small brightness and
contrast jitter (no hue or saturation change: colour questions), a translation of at most ~3% of the side
(the Shapes generator keeps objects farther than that from the border: counting), and no flip unless
`allow_hflip` is set, and even then never when any text of the item mentions left or right.

The work is split in two so datasets can cache the costly part: `prepare` (decode + letterbox -> uint8
tensor [3,S,S], deterministic) and `finish` (augment + normalize -> float tensor). Randomness comes from the
`generator` passed in (or torch's global RNG), so a seeded dataset draws the same augmentation on resume.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch
from PIL import Image
from torchvision.transforms.v2 import functional as F

from ..config import ModelConfig
from .images import load_image

_LEFT_RIGHT = re.compile(r"\b(left|right|leftmost|rightmost)\b", re.IGNORECASE)


def mentions_left_right(texts: Sequence[str]) -> bool:
    """True if any text talks about left/right, which a horizontal flip would make wrong."""
    return any(_LEFT_RIGHT.search(t or "") for t in texts)


class ImageTransform:
    """Callable PIL RGB (or any `load_image` input) -> FloatTensor [3, S, S], normalized."""

    def __init__(
        self,
        size: int,
        mean: Sequence[float],
        std: Sequence[float],
        train: bool = False,
        allow_hflip: bool = False,
        brightness: float = 0.1,
        contrast: float = 0.1,
        max_shift: float = 1 / 32,
    ):
        self.size, self.train, self.allow_hflip = int(size), bool(train), bool(allow_hflip)
        self.mean, self.std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        self._mean_t = torch.tensor(self.mean).view(-1, 1, 1)  # [3, 1, 1], built once, not per image
        self._std_t = torch.tensor(self.std).view(-1, 1, 1)
        self.fill = [round(m * 255) for m in self.mean]
        self.brightness, self.contrast = float(brightness), float(contrast)
        self.max_shift_px = max(1, round(max_shift * self.size)) if max_shift > 0 else 0  # 2 px at 64, 7 at 224

    def __repr__(self) -> str:
        return (
            f"ImageTransform(size={self.size}, train={self.train}, allow_hflip={self.allow_hflip}, "
            f"mean={self.mean}, std={self.std}, letterbox=True)"
        )

    def prepare(self, img: Any) -> torch.Tensor:
        """Letterboxed uint8 tensor [3, S, S] (deterministic; safe to cache)."""
        img = load_image(img) if not (isinstance(img, Image.Image) and img.mode == "RGB") else img
        w, h = img.size
        s = self.size
        if (w, h) != (s, s):
            scale = s / max(w, h)
            nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
            img = img.resize((nw, nh), Image.Resampling.BICUBIC, reducing_gap=3.0)
            if (nw, nh) != (s, s):
                canvas = Image.new("RGB", (s, s), tuple(self.fill))
                canvas.paste(img, ((s - nw) // 2, (s - nh) // 2))
                img = canvas
        return F.pil_to_tensor(img)

    def finish(
        self, x: torch.Tensor, texts: Sequence[str] = (), generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Augment (train only) and normalize a uint8 [3,S,S] tensor into a float tensor.
        Written as in-place tensor arithmetic with the semantics of torchvision's `to_dtype(scale=True)`,
        `adjust_brightness`, `adjust_contrast` and `normalize` (tests/test_data_transforms.py compares them):
        the functional calls cost ~0.4 ms an image in dispatch, a tenth of a CPU training step."""
        x = x.to(torch.float32).div_(255) if x.dtype == torch.uint8 else x.to(torch.float32, copy=True)
        if self.train:
            x = self._augment(x, texts, generator)
        return x.sub_(self._mean_t).div_(self._std_t)

    def _augment(self, x: torch.Tensor, texts: Sequence[str], g: torch.Generator | None) -> torch.Tensor:
        r = torch.rand(5, generator=g).tolist()
        b = 1 + self.brightness * (2 * r[0] - 1)
        c = 1 + self.contrast * (2 * r[1] - 1)
        x.mul_(b).clamp_(0, 1)  # adjust_brightness: blend with black
        gray = x[0].mul(0.2989).add_(x[1], alpha=0.587).add_(x[2], alpha=0.114)  # rgb_to_grayscale
        x.mul_(c).add_((1 - c) * gray.mean()).clamp_(0, 1)  # adjust_contrast: blend with the grey mean
        k = self.max_shift_px
        dx = int(round((2 * r[2] - 1) * k))
        dy = int(round((2 * r[3] - 1) * k))
        if dx or dy:
            x = _shift(x, dx, dy, [f / 255 for f in self.fill])
        if self.allow_hflip and r[4] < 0.5 and not mentions_left_right(texts):
            x = x.flip(-1)
        return x.clamp_(0, 1)

    def __call__(
        self, img: Any, texts: Sequence[str] = (), generator: torch.Generator | None = None
    ) -> torch.Tensor:
        return self.finish(self.prepare(img), texts=texts, generator=generator)


def _shift(x: torch.Tensor, dx: int, dy: int, fill: Sequence[float]) -> torch.Tensor:
    """Translate [3,H,W] by whole pixels, filling the uncovered border: a pad and a crop (F.affine's grid
    sampling costs ~30 ms per small image on a CPU, this a few microseconds)."""
    _, h, w = x.shape
    k = max(abs(dx), abs(dy))
    padded = torch.empty(3, h + 2 * k, w + 2 * k, dtype=x.dtype)
    padded[:] = torch.tensor(fill, dtype=x.dtype)[:, None, None]
    padded[:, k : k + h, k : k + w] = x
    return padded[:, k - dy : k - dy + h, k - dx : k - dx + w].contiguous()


def build_transform(cfg: ModelConfig, train: bool, allow_hflip: bool = False) -> ImageTransform:
    """The transform for `cfg`'s encoder: letterbox to cfg.vit_image_size, normalize with vit_mean/vit_std."""
    return ImageTransform(cfg.vit_image_size, cfg.vit_mean, cfg.vit_std, train=train, allow_hflip=allow_hflip)


def denormalize(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """Undo the normalization (for display): float [..,3,S,S] in 0..1."""
    m = torch.tensor(mean, dtype=x.dtype, device=x.device).view(-1, 1, 1)
    s = torch.tensor(std, dtype=x.dtype, device=x.device).view(-1, 1, 1)
    return (x * s + m).clamp(0, 1)


__all__ = ["ImageTransform", "build_transform", "denormalize", "mentions_left_right"]
