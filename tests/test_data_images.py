"""load_image: every mode becomes RGB, EXIF orientation is applied, bad and over-large files are refused."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

import vqa.data.images as images
from vqa.data.images import load_image
from vqa.errors import InputError


def test_rgb_passthrough_and_grayscale(tmp_path):
    p = tmp_path / "g.png"
    Image.new("L", (5, 4), 77).save(p)
    img = load_image(p)
    assert img.mode == "RGB" and img.size == (5, 4) and img.getpixel((0, 0)) == (77, 77, 77)
    assert load_image(str(p)).getpixel((4, 3)) == (77, 77, 77)


@pytest.mark.parametrize("mode, opaque, half", [
    ("RGBA", (0, 0, 255, 255), (200, 100, 0, 128)),
    ("LA", (90, 255), (40, 128)),
])
def test_alpha_composited_on_white(tmp_path, mode, opaque, half):
    im = Image.new(mode, (4, 4), (0,) * len(opaque))  # fully transparent black
    im.putpixel((1, 1), opaque)
    im.putpixel((2, 2), half)
    p = tmp_path / "a.png"
    im.save(p)
    img = load_image(p)
    assert img.mode == "RGB"

    def over_white(px):  # the reference: colour x alpha + white x (1 - alpha), a gray value on all three channels
        *color, alpha = px
        color = color * 3 if len(color) == 1 else color
        return [c * alpha / 255 + 255 * (1 - alpha / 255) for c in color]

    assert img.getpixel((0, 0)) == (255, 255, 255)  # fully transparent -> white
    assert list(img.getpixel((1, 1))) == over_white(opaque)  # opaque -> its own colour, exactly
    np.testing.assert_allclose(img.getpixel((2, 2)), over_white(half), atol=1)  # half -> between the two


def test_palette_with_and_without_transparency(tmp_path):
    im = Image.new("P", (4, 4), 1)
    im.putpalette([0, 0, 0, 200, 10, 10] + [0] * 762)
    p = tmp_path / "p.png"
    im.save(p)
    assert load_image(p).getpixel((0, 0)) == (200, 10, 10)
    im.save(p, transparency=1)
    assert load_image(p).getpixel((0, 0)) == (255, 255, 255)


def test_cmyk_jpeg(tmp_path):
    p = tmp_path / "c.jpg"
    Image.new("CMYK", (8, 8), (0, 255, 255, 0)).save(p, quality=100)
    r, g, b = load_image(p).getpixel((4, 4))
    assert r > 230 and g < 30 and b < 30


def test_16bit_scaled_to_8bit(tmp_path):
    arr = np.array([[0, 32768, 65535, 257]], dtype=np.uint16)
    p = tmp_path / "g16.png"
    Image.fromarray(arr).save(p)
    assert Image.open(p).mode.startswith("I")
    img = load_image(p)
    assert [img.getpixel((x, 0))[0] for x in range(4)] == [0, 128, 255, 1]
    p32 = tmp_path / "g32.tif"
    Image.fromarray(arr.astype(np.int32)).save(p32)
    assert Image.open(p32).mode == "I"
    assert load_image(p32).getpixel((2, 0)) == (255, 255, 255)


def test_exif_orientation_applied(tmp_path):
    im = Image.new("RGB", (40, 20), (0, 0, 0))
    im.paste((255, 0, 0), (0, 0, 10, 10))  # red block top-left
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated: display needs a 90 degree clockwise turn
    p = tmp_path / "rot.jpg"
    im.save(p, exif=exif, quality=95)
    img = load_image(p)
    assert img.size == (20, 40)
    r, g, b = img.getpixel((15, 5))  # top-left goes to top-right after a clockwise turn
    assert r > 200 and g < 60
    assert load_image(Image.open(p)).size == (20, 40)


def test_truncated_file(tmp_path):
    buf = io.BytesIO()
    Image.effect_noise((64, 64), 50).convert("RGB").save(buf, "PNG")
    p = tmp_path / "cut.png"
    p.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    with pytest.raises(InputError, match=r"cut\.png.*(truncated|unreadable)"):
        load_image(p)


def test_truncated_jpeg(tmp_path):
    buf = io.BytesIO()
    Image.effect_noise((64, 64), 50).convert("RGB").save(buf, "JPEG")
    p = tmp_path / "cut.jpg"
    p.write_bytes(buf.getvalue()[:300])
    with pytest.raises(InputError, match=r"cut\.jpg"):
        load_image(p)


def test_not_an_image_and_missing(tmp_path):
    p = tmp_path / "notes.png"
    p.write_text("hello")
    with pytest.raises(InputError, match=r"notes\.png: not an image"):
        load_image(p)
    with pytest.raises(InputError, match=r"nope\.png: image file not found"):
        load_image(tmp_path / "nope.png")
    with pytest.raises(InputError, match="not a file"):
        load_image(tmp_path)
    with pytest.raises(InputError, match="cannot read an image from a int"):
        load_image(3)


def test_pixel_limit(tmp_path, monkeypatch):
    p = tmp_path / "big.png"
    Image.new("RGB", (40, 30)).save(p)
    monkeypatch.setattr(images, "MAX_PIXELS", 1000)
    with pytest.raises(InputError, match=r"big\.png.*over the limit"):
        load_image(p)
    with pytest.raises(InputError, match="over the limit"):
        load_image(Image.new("RGB", (40, 30)))
    with pytest.raises(InputError, match="over the limit"):
        load_image(np.zeros((30, 40, 3), np.uint8))
    assert load_image(p, max_pixels=1200).size == (40, 30)
    monkeypatch.setattr(images, "MAX_PIXELS", 1200)
    assert load_image(p).size == (40, 30)


def test_pil_decompression_bomb_is_input_error(tmp_path, monkeypatch):
    p = tmp_path / "bomb.png"
    Image.new("RGB", (40, 30)).save(p)
    monkeypatch.setattr(images, "_check_pixels", lambda *a: None)  # reach PIL's own guard
    monkeypatch.setattr(images, "MAX_PIXELS", 500)
    with pytest.raises(InputError, match=r"bomb\.png: over the limit of 500 pixels") as e:
        load_image(p)  # 1,200 pixels: over PIL's error threshold (twice its limit) too
    assert str(e.value).count("limit") == 1 and "1000" not in str(e.value)  # one limit, said once
    assert "\n" not in str(e.value)


def test_arrays():
    a = np.zeros((6, 5, 3), np.uint8)
    a[0, 0] = (1, 2, 3)
    assert load_image(a).getpixel((0, 0)) == (1, 2, 3)
    assert load_image(torch.from_numpy(a)).size == (5, 6)
    assert load_image(torch.from_numpy(a).permute(2, 0, 1)).size == (5, 6)  # CHW accepted
    assert load_image(np.full((6, 5), 9, np.uint8)).getpixel((1, 1)) == (9, 9, 9)
    rgba = np.zeros((2, 2, 4), np.uint8)
    assert load_image(rgba).getpixel((0, 0)) == (255, 255, 255)
    assert load_image(np.full((2, 2), 65535, np.uint16)).getpixel((0, 0)) == (255, 255, 255)
    with pytest.raises(InputError, match="uint8"):
        load_image(np.zeros((4, 4, 3), np.float32))
    with pytest.raises(InputError, match="shape"):
        load_image(np.zeros((4, 4, 2), np.uint8))


def test_pil_global_limit_untouched(tmp_path, monkeypatch):
    before = Image.MAX_IMAGE_PIXELS
    p = tmp_path / "x.png"
    Image.new("RGB", (40, 30)).save(p)
    monkeypatch.setattr(images, "MAX_PIXELS", 100)
    with pytest.raises(InputError):
        load_image(p)
    assert Image.MAX_IMAGE_PIXELS == before
