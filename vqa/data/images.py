"""Image loading: one function turns any supported input into an RGB PIL image, or raises a clear InputError.

Why one place: files come from users' folders, the demo and data sets, and every path must apply the EXIF
orientation, convert odd modes (grayscale, alpha, palette, CMYK, 16-bit) the same way and refuse
decompression bombs, without ever surfacing a deep PIL traceback.
"""

from __future__ import annotations

import io
import struct
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from ..errors import InputError

MAX_PIXELS = 64_000_000  # refuse images with more pixels than this (64 megapixels); tests monkeypatch it
ImageFile.LOAD_TRUNCATED_IMAGES = False  # a truncated file is an error, never a half-grey image
_OPEN_LOCK = threading.Lock()
_ALPHA_MODES = {"RGBA", "LA", "PA", "RGBa", "La"}
_WHITE = (255, 255, 255)


Draft = Callable[[tuple[int, int]], tuple[int, int]]  # a JPEG's (width, height) -> the least size to decode it at


def load_image(src: Any, max_pixels: int | None = None, draft: Draft | None = None,
               name: str | None = None) -> Image.Image:
    """An RGB image from a path, encoded bytes (a shard's KEY.jpg), a PIL image or a uint8 HWC numpy/torch
    array.

    EXIF orientation is applied; L/LA/P/RGBA (composited on white)/CMYK/16-bit images become 8-bit RGB.
    `draft(size)`: a JPEG file or bytes is decoded at the smallest of 1/2, 1/4 or 1/8 scale whose sides are
    still >= the size it returns (libjpeg's DCT scaling, PIL's `draft`); `vqa.data.preprocess` says what a
    model needs.
    Raises InputError (naming the file, or `name` for bytes) for missing, truncated, unreadable or
    over-large images."""
    limit = MAX_PIXELS if max_pixels is None else max_pixels
    if isinstance(src, Image.Image):
        _check_pixels(src.size, limit, "the image")
        return to_rgb(ImageOps.exif_transpose(src) if src.getexif() else src)
    if isinstance(src, (str, Path)):
        path = Path(src)
        if not path.exists():
            raise InputError(f"{path}: image file not found")
        if not path.is_file():
            raise InputError(f"{path}: not a file")
        return _decode_file(path, str(path), limit, draft)
    if isinstance(src, (bytes, bytearray, memoryview)):
        return _decode_file(io.BytesIO(src), name or "the image bytes", limit, draft)
    if isinstance(src, np.ndarray) or (type(src).__module__.startswith("torch") and hasattr(src, "numpy")):
        img = _from_array(src)
        _check_pixels(img.size, limit, "the image array")
        return to_rgb(img)
    raise InputError(f"cannot read an image from a {type(src).__name__}; give a path, a PIL image or an array")


def _check_pixels(size: tuple[int, int], limit: int, what: str) -> None:
    w, h = size
    if w < 1 or h < 1:
        raise InputError(f"{what} is {w}x{h} pixels: it is empty (an image needs at least 1x1 pixel)")
    if w * h > limit:
        raise InputError(
            f"{what} is {w}x{h} = {w * h:,} pixels, over the limit of {limit:,} "
            "(refused as a possible decompression bomb; raise vqa.data.images.MAX_PIXELS if you trust it)"
        )


def _decode_file(fp: Any, name: str, limit: int, draft: Draft | None) -> Image.Image:
    try:
        with _open(fp, limit) as im:
            _check_pixels(im.size, limit, name)
            if draft and im.format == "JPEG":
                im.draft(None, draft(im.size))
            im.load()
            img = ImageOps.exif_transpose(im) if im.getexif() else im.copy()
    except InputError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        size = _header_size(fp)  # PIL's message names its own threshold: the user's limit is the one to say
        if size is not None:
            _check_pixels(size, limit, name)
        raise InputError(f"{name}: over the limit of {limit:,} pixels (refused as a possible decompression "
                         "bomb; raise vqa.data.images.MAX_PIXELS if you trust it)") from None
    except UnidentifiedImageError:
        raise InputError(f"{name}: not an image file (or a format PIL cannot read)") from None
    except (OSError, SyntaxError, ValueError, EOFError, struct.error) as e:
        msg = str(e) or type(e).__name__
        if "truncated" in msg.lower():
            raise InputError(f"{name}: truncated image file ({msg})") from None
        raise InputError(f"{name}: unreadable image ({msg})") from None
    return to_rgb(img)


@contextmanager
def _pil_limit(limit: int | None) -> Iterator[None]:
    """PIL's decompression-bomb guard set to `limit` (None: off) for this block only, restored after under a
    lock, so other code and threads keep PIL's default."""
    with _OPEN_LOCK:
        saved = Image.MAX_IMAGE_PIXELS
        Image.MAX_IMAGE_PIXELS = limit
        try:
            yield
        finally:
            Image.MAX_IMAGE_PIXELS = saved


def _open(path: Any, limit: int) -> Image.Image:
    """Image.open under a guard of `limit`; its warning is an error, so a picture over `limit` is refused
    whichever of PIL's two thresholds it crosses."""
    with _pil_limit(limit), warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        return Image.open(path)


def _header_size(fp: Any) -> tuple[int, int] | None:
    """(width, height) from a picture's header, with PIL's guard off (nothing is decoded); None if unreadable."""
    try:
        if hasattr(fp, "seek"):
            fp.seek(0)
        with _pil_limit(None), Image.open(fp) as im:
            return im.size
    except Exception:  # noqa: BLE001 -- only a better message is lost
        return None


def _from_array(src: Any) -> Image.Image:
    arr = src if isinstance(src, np.ndarray) else src.detach().cpu().numpy()
    if (not isinstance(src, np.ndarray) and arr.ndim == 3 and arr.shape[0] in (1, 3, 4)
            and arr.shape[-1] not in (1, 3, 4)):
        arr = np.transpose(arr, (1, 2, 0))  # a CHW torch tensor (torchvision's layout): accept it
    if arr.ndim == 3 and arr.shape[-1] == 1:
        arr = arr[..., 0]
    if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[-1] not in (3, 4)):
        raise InputError(f"an image array must be HxW or HxWxC with C in 1, 3, 4; got shape {tuple(arr.shape)}")
    if 0 in arr.shape[:2]:
        raise InputError(f"the image array of shape {tuple(arr.shape)} has no pixels (its height or width is 0)")
    if arr.dtype == np.uint16:
        arr = (arr >> 8).astype(np.uint8)
    elif arr.dtype != np.uint8:
        raise InputError(f"an image array must be uint8 (or uint16), not {arr.dtype}")
    return Image.fromarray(np.ascontiguousarray(arr))


def to_rgb(img: Image.Image) -> Image.Image:
    """8-bit RGB from any PIL mode; transparency is composited on white, 16/32-bit ints scaled to 8 bits."""
    mode = img.mode
    if mode == "RGB":
        return img
    if mode == "P" and "transparency" in img.info:
        img, mode = img.convert("RGBA"), "RGBA"
    if mode in _ALPHA_MODES:
        rgba = img.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, _WHITE + (255,))
        return Image.alpha_composite(bg, rgba).convert("RGB")
    if mode.startswith("I;16") or mode == "I":
        arr = np.asarray(img).astype(np.int64)
        # 16-bit data (and PIL's 32-bit "I", which 16-bit PNGs and TIFFs may load as): scale 0..65535 to 0..255
        arr = (np.clip(arr, 0, 65535) >> 8).astype(np.uint8)
        return Image.fromarray(arr).convert("RGB")
    if mode == "F":
        arr = np.asarray(img, dtype=np.float32)
        scale = 255.0 if arr.size and float(arr.max()) <= 1.0 else 1.0
        return Image.fromarray(np.clip(arr * scale, 0, 255).astype(np.uint8)).convert("RGB")
    return img.convert("RGB")  # L, 1, P, CMYK, YCbCr, LAB, HSV


RESAMPLE = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR}


def letterbox(img: Image.Image, size: int, fill: tuple[int, int, int], resample: str = "bicubic") -> Image.Image:
    """`img` (RGB) resized so its longer side is `size` (bicubic, aspect kept) and centred on a size x size
    canvas of `fill`: the model's square input, nothing cropped. Torch-free, so the ONNX runtime path uses it
    too."""
    w, h = img.size
    if (w, h) == (size, size):
        return img
    scale = size / max(w, h)
    nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
    img = img.resize((nw, nh), RESAMPLE[resample], reducing_gap=3.0)
    if (nw, nh) != (size, size):
        canvas = Image.new("RGB", (size, size), tuple(fill))
        canvas.paste(img, ((size - nw) // 2, (size - nh) // 2))
        img = canvas
    return img


def squash(img: Image.Image, size: int, resample: str = "bilinear") -> Image.Image:
    """`img` stretched to size x size, aspect not kept: what Hugging Face's ViTImageProcessor does (PIL
    resize, no reducing gap), for models trained that way (ModelConfig.vit_resize="squash")."""
    return img if img.size == (size, size) else img.resize((size, size), RESAMPLE[resample])


def fit(img: Image.Image, size: int, fill: tuple[int, int, int], resize: str = "letterbox",
        resample: str = "bicubic") -> Image.Image:
    """The model's square input: `letterbox` or `squash` by ModelConfig.vit_resize."""
    return squash(img, size, resample) if resize == "squash" else letterbox(img, size, fill, resample)


def check_image(path: str | Path) -> str | None:
    """None if the file decodes as an image, else the reason; used by `vqa data info --check-images`."""
    try:
        load_image(path)
    except InputError as e:
        return str(e)
    return None
