"""Transforms: letterbox + normalize, seeded mild augmentation, and no flips for left/right text."""

from __future__ import annotations

import torch
from PIL import Image

from vqa.config import ModelConfig
from vqa.data.transforms import ImageTransform, build_transform, mentions_left_right


def denormalize(x: torch.Tensor, mean, std) -> torch.Tensor:
    """Undo the normalization: float [..,3,S,S] in 0..1."""
    return (x * torch.tensor(std).view(-1, 1, 1) + torch.tensor(mean).view(-1, 1, 1)).clamp(0, 1)


def test_shape_and_normalization_from_config():
    cfg = ModelConfig(vit_image_size=32, vit_patch_size=8, vit_mean=(0.2, 0.4, 0.6), vit_std=(0.1, 0.2, 0.3))
    t = build_transform(cfg, train=False)
    x = t(Image.new("RGB", (32, 32), (51, 102, 153)))  # exactly the mean colour
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32
    assert x.abs().max() < 0.03
    x = t(Image.new("RGB", (32, 32), (255, 255, 255)))
    assert torch.allclose(x[:, 0, 0], torch.tensor([8.0, 3.0, 4 / 3]), atol=1e-4)
    assert torch.allclose(denormalize(x, cfg.vit_mean, cfg.vit_std), torch.ones_like(x))


def test_letterbox_keeps_aspect_and_pads_with_mean():
    t = ImageTransform(64, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    u8 = t.prepare(Image.new("RGB", (128, 64), (255, 0, 0)))  # 2:1 -> 64x32 in the middle
    assert u8.shape == (3, 64, 64) and u8.dtype == torch.uint8
    assert u8[:, 16:48, :].float().mean(dim=(1, 2)).tolist() == [255.0, 0.0, 0.0]
    assert (u8[:, :16] == 128).all() and (u8[:, 48:] == 128).all()  # padding = mean colour
    x = t.finish(u8)
    assert x[:, :16].abs().max() < 0.01  # -> 0 after normalization
    tall = t.prepare(Image.new("RGB", (10, 40), (0, 255, 0)))
    assert (tall[:, :, :24] == 128).all() and tall[1, 32, 32] == 255


def test_eval_deterministic_train_seeded():
    img = Image.effect_noise((64, 64), 40).convert("RGB")
    ev = ImageTransform(64, (0.5,) * 3, (0.5,) * 3, train=False)
    assert torch.equal(ev(img), ev(img))
    tr = ImageTransform(64, (0.5,) * 3, (0.5,) * 3, train=True)
    a = tr(img, generator=torch.Generator().manual_seed(1))
    b = tr(img, generator=torch.Generator().manual_seed(1))
    c = tr(img, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert (a - ev(img)).abs().mean() < 0.5  # mild
    torch.manual_seed(5)
    d = tr(img)
    torch.manual_seed(5)
    assert torch.equal(d, tr(img))  # the global RNG is used without a generator


def test_augmentation_keeps_colours_and_objects():
    img = Image.new("RGB", (64, 64), (128, 128, 128))
    img.paste((220, 40, 40), (3, 3, 12, 12))  # a small red square 3 px from the corner
    tr = ImageTransform(64, (0.5,) * 3, (0.5,) * 3, train=True)
    for s in range(20):
        x = denormalize(tr(img, generator=torch.Generator().manual_seed(s)), (0.5,) * 3, (0.5,) * 3)
        red = (x[0] > x[1] + 0.3) & (x[0] > x[2] + 0.3)
        assert red.sum() >= 81 - 2 * 9, s  # the square stays in frame (shift <= 2 px) and stays red


def test_hflip_only_when_allowed_and_text_is_not_left_right():
    img = Image.new("RGB", (64, 64), (0, 0, 0))
    img.paste((255, 255, 255), (0, 0, 20, 64))  # white on the left
    kw = dict(train=True, brightness=0.0, contrast=0.0, max_shift=0.0)
    flip = ImageTransform(64, (0.5,) * 3, (0.5,) * 3, allow_hflip=True, **kw)
    no_flip = ImageTransform(64, (0.5,) * 3, (0.5,) * 3, **kw)

    def left_white(t, texts):
        return [t(img, texts=texts, generator=torch.Generator().manual_seed(s))[0, 32, 5] > 0 for s in range(30)]

    assert all(left_white(no_flip, ["what color is it?"]))
    assert not all(left_white(flip, ["what color is it?"]))  # flips happen when allowed
    assert all(left_white(flip, ["is the circle left of the square?"]))
    assert all(left_white(flip, ["what color is it?", "a red circle on the Right"]))
    assert mentions_left_right(["the leftmost object"]) and not mentions_left_right(["a bright red leftover"])


def test_fused_arithmetic_equals_torchvision_functionals():
    """The shift and flip happen on uint8 in the loader worker, brightness / contrast / normalization on the
    device (`normalize_images`, one batch at a time); together they must equal torchvision's to_dtype /
    adjust_brightness / adjust_contrast / normalize drawn from the same generator, and `finish` (the CPU path
    for one image) must be the same arithmetic."""
    from torchvision.transforms.v2 import functional as F

    from vqa.data.transforms import ImageNormalizer, _shift

    u8 = ImageTransform(64, (0.5,) * 3, (0.5,) * 3).prepare(Image.effect_noise((64, 64), 60).convert("RGB"))
    u8[0, 10:30, 10:30] = 250  # a saturated patch: the clamps matter
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    t = ImageTransform(64, mean, std, train=True, allow_hflip=True, brightness=0.3, contrast=0.3)
    shifted, jitters, wants = [], [], []
    for seed in range(12):
        r = torch.rand(5, generator=torch.Generator().manual_seed(seed)).tolist()
        dx, dy = (int(round((2 * v - 1) * t.max_shift_px)) for v in r[2:4])
        x = _shift(u8, dx, dy, t.fill) if dx or dy else u8
        if r[4] < 0.5:
            x = F.horizontal_flip(x)
        x = F.to_dtype(x, torch.float32, scale=True)
        x = F.adjust_contrast(F.adjust_brightness(x, 1 + 0.3 * (2 * r[0] - 1)), 1 + 0.3 * (2 * r[1] - 1))
        want = F.normalize(x.clamp(0, 1), list(mean), list(std))
        got = t.finish(u8, generator=torch.Generator().manual_seed(seed))
        assert torch.allclose(got, want, atol=1e-5), seed
        x8, jitter = t.augment(u8, generator=torch.Generator().manual_seed(seed))
        assert x8.dtype == torch.uint8
        shifted.append(x8)
        jitters.append(jitter)
        wants.append(want)
    batch = ImageNormalizer(mean, std)(torch.stack(shifted), torch.stack(jitters), "cpu")  # the device path
    assert torch.allclose(batch, torch.stack(wants), atol=1e-5)
    ev = ImageTransform(64, mean, std)
    assert torch.allclose(ev.finish(u8), F.normalize(F.to_dtype(u8, torch.float32, scale=True), list(mean), list(std)),
                          atol=1e-6)
    f = u8.float() / 255
    ev.finish(f)
    assert torch.equal(f, u8.float() / 255)  # a float input is not modified in place
