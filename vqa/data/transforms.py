"""Image transforms: the model's square input (`vqa.data.preprocess`), light augmentation, normalization.

Aspect ratio: images are *letterboxed*: the longer side is resized to S keeping the aspect ratio, and the
shorter side is padded (equally on both sides) to S with the encoder's mean colour, which becomes 0 after
normalization. Nothing is cropped, so no object or text-relevant region is ever cut away. A model imported
from Hugging Face (`vqa import`) was trained on squashed images (ViTImageProcessor: stretched to the square,
bilinear) and keeps that resize (ModelConfig.vit_resize="squash", vit_resample="bilinear").

Augmentation (train only) is deliberately mild so it never changes a question's answer: small brightness and
contrast jitter (no hue or saturation change: colour questions), a translation of at most ~3% of the side
(the Shapes generator keeps objects farther than that from the border: counting), and no flip unless
`allow_hflip` is set, and even then never when any text of the item (a question, any of its answers, a
caption) mentions left or right.

The work is split in three so that images cross process boundaries as uint8 and the float work happens on
the device: `prepare` (`vqa.data.preprocess.model_input`, the one path from a picture to the model's uint8
[3,S,S] input that serving uses too; deterministic, what the image cache holds), `augment` (in the loader worker: the
shift and flip on uint8, and the brightness / contrast factors drawn for the device) and `ImageNormalizer` (on the
device, for a whole batch: brightness, contrast, normalization). `finish` runs the last two on the CPU for one image
(the predictor, tests). Randomness comes from the `generator` passed in (or torch's global RNG), so a seeded dataset
draws the same augmentation on resume.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch

from ..config import ModelConfig
from .preprocess import Preprocess, model_input

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
        resize: str = "letterbox",
        resample: str = "bicubic",
        max_pixels: int | None = None,
    ):
        self.pre = Preprocess.of(size, mean, std, resize, resample, max_pixels)  # what `prepare` does
        self.size, self.train, self.allow_hflip = self.pre.size, bool(train), bool(allow_hflip)
        self.resize, self.resample = resize, resample  # ModelConfig.vit_resize / vit_resample
        self.mean, self.std = self.pre.mean, self.pre.std
        self._mean_t = torch.tensor(self.mean).view(-1, 1, 1)  # [3, 1, 1], built once, not per image
        self._std_t = torch.tensor(self.std).view(-1, 1, 1)
        self.fill = list(self.pre.fill)
        self.brightness, self.contrast = float(brightness), float(contrast)
        self.max_shift_px = max(1, round(max_shift * self.size)) if max_shift > 0 else 0  # 2 px at 64, 7 at 224

    def __repr__(self) -> str:
        return (
            f"ImageTransform(size={self.size}, train={self.train}, allow_hflip={self.allow_hflip}, "
            f"mean={self.mean}, std={self.std}, resize={self.resize!r}, resample={self.resample!r})"
        )

    def prepare(self, img: Any, name: str | None = None) -> torch.Tensor:
        """The model's uint8 input [3, S, S] (`vqa.data.preprocess.model_input` with `self.pre`;
        deterministic, safe to cache)."""
        return model_input(img, self.pre, name)

    def augment(
        self, x: torch.Tensor, texts: Sequence[str] = (), generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(uint8 [3,S,S] shifted / flipped, [2] brightness and contrast factors) for training; (x, None) in
        evaluation. The factors are applied with the normalization, on the device (`ImageNormalizer`)."""
        x, jitter, _ = self.augment_moves(x, texts, generator)
        return x, jitter

    def augment_moves(
        self, x: torch.Tensor, texts: Sequence[str] = (), generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, tuple[int, int, bool]]:
        """`augment`, and how the picture moved: (dx, dy, flipped), content shifted by +dx, +dy pixels and then
        mirrored left to right, so that boxes on it can follow (`vqa.data.regions`)."""
        if not self.train:
            return x, None, (0, 0, False)
        r = torch.rand(5, generator=generator).tolist()
        jitter = torch.tensor([1 + self.brightness * (2 * r[0] - 1), 1 + self.contrast * (2 * r[1] - 1)])
        k = self.max_shift_px
        dx = int(round((2 * r[2] - 1) * k))
        dy = int(round((2 * r[3] - 1) * k))
        if dx or dy:
            fill = self.fill if x.dtype == torch.uint8 else [f / 255 for f in self.fill]
            x = _shift(x, dx, dy, fill)
        flipped = self.allow_hflip and r[4] < 0.5 and not mentions_left_right(texts)
        if flipped:
            x = x.flip(-1)
        return x, jitter, (dx, dy, flipped)

    def finish(
        self, x: torch.Tensor, texts: Sequence[str] = (), generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Augment (train only) and normalize one uint8 [3,S,S] image into a float tensor, on the CPU: the
        same arithmetic as the device path (tests/test_data_transforms.py checks it against torchvision)."""
        x, jitter = self.augment(x, texts, generator)
        return normalize_images(x[None], self._mean_t[None], self._std_t[None],
                                None if jitter is None else jitter[None])[0]

    def __call__(
        self, img: Any, texts: Sequence[str] = (), generator: torch.Generator | None = None
    ) -> torch.Tensor:
        return self.finish(self.prepare(img), texts=texts, generator=generator)


def normalize_images(
    x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, jitter: torch.Tensor | None = None
) -> torch.Tensor:
    """uint8 (or 0..1 float) [M,3,S,S] -> normalized float [M,3,S,S]. With `jitter` [M,2]: each image's
    brightness (blend with black) then contrast (blend with its grey mean) factor first, with the semantics of
    torchvision's `adjust_brightness` / `adjust_contrast`. mean / std: [1,3,1,1] on x's device."""
    x = x.to(torch.float32).div_(255) if x.dtype == torch.uint8 else x.to(torch.float32, copy=True)
    if jitter is not None:
        jitter = jitter.to(torch.float32)
        b, c = jitter[:, 0].view(-1, 1, 1, 1), jitter[:, 1].view(-1, 1, 1, 1)
        x.mul_(b).clamp_(0, 1)
        gray = x[:, 0].mul(0.2989).add_(x[:, 1], alpha=0.587).add_(x[:, 2], alpha=0.114)  # rgb_to_grayscale
        x.mul_(c).add_((1 - c) * gray.mean(dim=(1, 2)).view(-1, 1, 1, 1)).clamp_(0, 1)
    return x.sub_(mean).div_(std)


class ImageNormalizer:
    """A batch's uint8 images (and training jitter) -> the model's float input, on `device`: images cross
    process boundaries and the PCIe bus as uint8 (a quarter of float32), and the float work runs where it is
    cheapest. Mean / std tensors are made once per device, so a step copies nothing else."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        self.mean, self.std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, images: torch.Tensor, jitter: torch.Tensor | None = None, device=None) -> torch.Tensor:
        device = torch.device(device) if device is not None else images.device
        if device not in self._on:
            self._on[device] = (torch.tensor(self.mean, device=device).view(1, 3, 1, 1),
                                torch.tensor(self.std, device=device).view(1, 3, 1, 1))
        mean, std = self._on[device]
        images = images.to(device, non_blocking=True)
        if jitter is not None:
            jitter = jitter.to(device, non_blocking=True)
        return normalize_images(images, mean, std, jitter)


def _shift(x: torch.Tensor, dx: int, dy: int, fill: Sequence[float]) -> torch.Tensor:
    """Translate [3,H,W] by whole pixels, filling the uncovered border: a pad and a crop, far cheaper on a CPU than
    F.affine's grid sampling (docs/results/preprocessing.md)."""
    _, h, w = x.shape
    k = max(abs(dx), abs(dy))
    padded = torch.empty(3, h + 2 * k, w + 2 * k, dtype=x.dtype)
    padded[:] = torch.tensor(fill, dtype=x.dtype)[:, None, None]
    padded[:, k : k + h, k : k + w] = x
    return padded[:, k - dy : k - dy + h, k - dx : k - dx + w].contiguous()


def build_transform(cfg: ModelConfig, train: bool, allow_hflip: bool = False,
                    max_pixels: int | None = None) -> ImageTransform:
    """The transform for `cfg`'s encoder: `Preprocess.from_config(cfg)` (letterbox or squash to
    cfg.vit_image_size), then normalize with vit_mean/vit_std."""
    return ImageTransform(cfg.vit_image_size, cfg.vit_mean, cfg.vit_std, train=train, allow_hflip=allow_hflip,
                          resize=cfg.vit_resize, resample=cfg.vit_resample, max_pixels=max_pixels)


__all__ = ["ImageTransform", "ImageNormalizer", "build_transform", "mentions_left_right",
           "normalize_images"]
