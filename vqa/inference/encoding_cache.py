"""The Predictor's encoding cache: the image encoder's output for the last few distinct pictures, so that a
second question about a picture only runs the decoder.

A picture is kept under `encoding_key`: the SHA-1 of the whole preprocessing (`Preprocess.key`) and of the
uint8 model input, so one picture from a path, a PIL image or an array shares an entry, and the same pixels
under another preprocessing do not. The least recently used entry goes first.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

from ..data.preprocess import Preprocess


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


__all__ = ["EncodingCache", "encoding_key"]
