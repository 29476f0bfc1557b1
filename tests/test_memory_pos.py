"""`vit_memory_pos`: fixed 2-D sin-cos positions added to the image tokens the decoder attends to."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import random_images, tiny_config, tiny_model

from vqa.config import ModelConfig, preset
from vqa.errors import ConfigError


def test_memory_positions_are_added_to_the_patch_tokens_only():
    cfg = tiny_config()
    plain, placed = tiny_model(), tiny_model(vit_memory_pos=True)
    placed.load_state_dict(plain.state_dict())  # the same weights: the table is a buffer, not saved
    images = random_images(2, cfg)
    with torch.no_grad():
        diff = placed.encode(images) - plain.encode(images)  # [2, 1 + 16, 32]
    torch.testing.assert_close(diff[0], diff[1])  # the same for every image
    table = diff[0]
    assert torch.count_nonzero(table[0]) == 0  # the CLS token has no position
    q, grid = cfg.dec_width // 4, cfg.vit_image_size // cfg.vit_patch_size
    for row, col in ((0, 0), (2, 1), (3, 3)):  # token 1 + row * grid + col, worked by hand
        got = table[1 + row * grid + col]
        for i in range(q):
            w = 100.0 ** (-i / q)
            expect = (math.sin(row * w), math.sin(col * w), math.cos(row * w), math.cos(col * w))
            assert [float(got[k * q + i]) for k in range(4)] == pytest.approx(expect, abs=1e-5)
    patches = table[1:]
    assert torch.cdist(patches, patches).add(torch.eye(len(patches)) * 9).min() > 0.1  # every patch distinct


def test_memory_positions_need_a_width_divisible_by_four():
    with pytest.raises(ConfigError, match="divisible by 4"):
        tiny_config(vit_memory_pos=True, dec_width=30, dec_heads=3)


def test_tiny_preset_uses_them_and_older_configs_load_without():
    assert preset("tiny").vit_memory_pos
    old = {k: v for k, v in preset("tiny").to_dict().items() if k != "vit_memory_pos"}  # a config.json from before
    assert ModelConfig.from_dict(old).vit_memory_pos is False
