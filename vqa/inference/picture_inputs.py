"""The Predictor's pictures: how any accepted input (a path, bytes, a PIL image, an array) becomes the model's
input, through `vqa.data.preprocess.model_input` with the model's preprocessing (training's), and the key
its encoding is kept under (`vqa.inference.encoding_cache.encoding_key`)."""

from __future__ import annotations

from typing import Any

import torch
from PIL import Image

from ..data.images import load_image
from ..data.preprocess import Preprocess
from ..errors import InputError
from .encoding_cache import encoding_key


class PictureInputs:
    """The picture side of `vqa.inference.predict.Predictor`: needs `self.transform` (its ImageTransform) and
    `self.cfg`."""

    @property
    def preprocess(self) -> Preprocess:
        """How a picture becomes this model's input: the settings of training's, with this Predictor's pixel
        limit."""
        return self.transform.pre

    @property
    def max_pixels(self) -> int | None:
        """The pixel limit (None: `vqa.data.images.MAX_PIXELS`)."""
        return self.transform.pre.max_pixels

    @max_pixels.setter
    def max_pixels(self, value: int | None) -> None:
        self.transform.pre = self.transform.pre.with_limit(value)

    def load(self, image: Any) -> Image.Image:
        """The RGB PIL image of any accepted input, at full size, for display (raises InputError for bad or
        over-large images)."""
        if image is None:
            raise InputError("no image given")
        return load_image(image, max_pixels=self.max_pixels)

    def model_input(self, image: Any) -> torch.Tensor:
        """The model's uint8 input [3, S, S] of any accepted input (`vqa.data.preprocess.model_input`); one
        already made is passed through."""
        if image is None:
            raise InputError("no image given")
        s = self.cfg.vit_image_size
        if torch.is_tensor(image) and image.dtype == torch.uint8 and tuple(image.shape) == (3, s, s):
            return image  # already the model input (a collection job's loader workers, the demo)
        return self.transform.prepare(image)

    def _prepare(self, image: Any) -> tuple[str, torch.Tensor]:
        x = self.model_input(image)
        return encoding_key(self.preprocess, x), x


__all__ = ["PictureInputs"]
