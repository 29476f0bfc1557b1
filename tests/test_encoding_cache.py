"""The Predictor's encoding cache on its own: what it keys on, that it encodes only what it does not hold,
and that the least recently used encoding goes first."""

from __future__ import annotations

import torch

from vqa.data.preprocess import Preprocess
from vqa.inference.picture_inputs import EncodingCache, encoding_key


def picture(value: int) -> torch.Tensor:
    return torch.full((3, 4, 4), value, dtype=torch.uint8)


class Encoder:
    """An encoder [B, 3, S, S] -> [B, 2, 1] (each picture's first pixel, twice) that records its batches."""

    def __init__(self):
        self.calls: list[int] = []

    def __call__(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        self.calls.append(len(inputs))
        return torch.stack([x[0, 0, 0].float().repeat(2, 1) for x in inputs])


def test_the_key_holds_every_preprocessing_setting_and_the_pixels():
    x = picture(7)
    pre = Preprocess(4)
    assert encoding_key(pre, x) == encoding_key(Preprocess(4), x.clone())
    others = [Preprocess(4, resize="squash"), Preprocess(4, resample="bilinear"), Preprocess(4, fill=(1, 1, 1)),
              Preprocess(4, mean=(0.4, 0.5, 0.5)), Preprocess(4, std=(0.2, 0.5, 0.5)), Preprocess(4, max_pixels=99)]
    keys = {encoding_key(p, x) for p in others} | {encoding_key(pre, x), encoding_key(pre, picture(8))}
    assert len(keys) == len(others) + 2


def test_a_batch_encodes_each_distinct_picture_once_and_only_those_not_kept():
    cache, encode = EncodingCache(4), Encoder()
    memory, index = cache.memory([("a", picture(1)), ("b", picture(2)), ("a", picture(1))], encode)
    assert encode.calls == [2]
    assert index == [0, 1, 0]
    assert memory.shape == (2, 2, 1) and memory[:, 0, 0].tolist() == [1.0, 2.0]
    memory, index = cache.memory([("c", picture(3)), ("b", picture(2))], encode)
    assert encode.calls == [2, 1]  # only c was encoded
    assert index == [0, 1] and memory[:, 0, 0].tolist() == [3.0, 2.0]


def test_the_least_recently_used_encoding_goes_first():
    cache, encode = EncodingCache(2), Encoder()
    cache.memory([("a", picture(1))], encode)
    cache.memory([("b", picture(2))], encode)
    cache.memory([("a", picture(1))], encode)  # a is used again: b is now the oldest
    cache.memory([("c", picture(3))], encode)
    assert len(cache) == 2 and "a" in cache and "c" in cache and "b" not in cache
    assert encode.calls == [1, 1, 1]
    cache.clear()
    assert len(cache) == 0
