"""The Predictor's pictures: how any accepted input (a path, bytes, a PIL image, an array) becomes the model's
input, through `vqa.data.preprocess.model_input` with the model's preprocessing (training's), and the cache of
their encodings, so that a second question about a picture only runs the decoder.

A picture's encoding is kept under `encoding_key`: the SHA-1 of the whole preprocessing (`Preprocess.key`) and
of the uint8 model input, so one picture from a path, a PIL image or an array shares an entry, and the same
pixels under another preprocessing do not. The least recently used entry goes first (`EncodingCache`).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from PIL import Image

from ..data.images import load_image
from ..data.preprocess import Preprocess
from ..errors import InputError


def encoding_key(pre: Preprocess, x: torch.Tensor) -> str:
    """The key of the model input `x` [3, S, S] (uint8) made by `pre`."""
    h = hashlib.sha1(pre.key().encode())
    h.update(x.numpy().tobytes())
    return h.hexdigest()


class EncodingCache:
    """Encodings [N, D] by key, at most `size` of them, least recently used dropped first."""

    def __init__(self, size: int = 8):
        self.size = int(size)
        self._kept: OrderedDict[str, torch.Tensor] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def __contains__(self, key: str) -> bool:
        return key in self._kept

    def clear(self) -> None:
        self._kept.clear()

    def memory(self, pictures: Sequence[tuple[str, torch.Tensor]],
               encode: Callable[[list[torch.Tensor]], torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
        """Memory [M, N, D] of the M distinct keys among `pictures` ((key, model input) pairs) and each
        picture's row in it. `encode(inputs)` -> [len(inputs), N, D] runs once, for the keys not kept."""
        keys: list[str] = []
        inputs: dict[str, torch.Tensor] = {}
        index = []
        for key, x in pictures:
            if key not in inputs:
                inputs[key] = x
                keys.append(key)
            index.append(keys.index(key))
        missing = [k for k in keys if k not in self._kept]
        if missing:
            for k, m in zip(missing, encode([inputs[k] for k in missing]), strict=True):
                self._kept[k] = m
        rows = []
        for k in keys:
            self._kept.move_to_end(k)  # used now: the last to go
            rows.append(self._kept[k])
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)
        return torch.stack(rows), index



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


__all__ = ["PictureInputs", "EncodingCache", "encoding_key"]
