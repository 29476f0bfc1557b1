"""The demo's picture input, the memory its decoded pictures may take, and what its messages say about uploads.

`Upload` is the server's path to an uploaded picture that remembers the name the user gave the file;
`picture_input` is the gr.Image that hands handlers an `Upload` (never decoding it: gradio would decode and
re-encode any picture that is not RGB) and refuses one whose header says it is over the pixel limit, with a
message naming the file; `DecodeBudget` bounds the bytes of the pictures decoded at once by all requests;
`user_message` rewrites any server path in a message to the user's name for the file.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gradio as gr
from PIL import Image

from ..data import images
from ..inference.serving import Busy

DECODED_BYTES_PER_PIXEL = 8  # PIL keeps RGB(A) in 4 bytes a pixel, and load_image holds a copy as it decodes
DECODE_BUDGET = 1 << 30  # bytes of decoded pictures held at once by all requests (2 at the pixel limit)
DECODE_WAIT = 60.0  # seconds a request waits for room in the budget before it is told the demo is busy
# PIL allocates a picture in blocks of this size; over glibc's largest mmap threshold (32 MiB), each block is
# mapped and handed back to the system when freed. PIL's default (16 MiB) stays in the allocator's per-thread
# arenas, so the RSS keeps what large uploads freed (docs/results/demo.md measures both)
PIL_BLOCK_SIZE = 64 << 20


class Upload(str):
    """The server's path to an uploaded picture (it is that path, as a str) that also remembers the name the
    user gave the file, so messages can name it without showing the server's folders."""

    display_name: str

    def __new__(cls, path: str, display_name: str | None):
        obj = super().__new__(cls, path)
        obj.display_name = display_name or "the uploaded file"
        return obj


def picture_input(**kwargs) -> gr.Image:
    """A gr.Image (type filepath) that hands the function an `Upload` (path + the user's file name), and
    whose decoding failures (a file that is not a picture, a decompression bomb) become a message naming the
    file as the user called it. The guard wraps this one instance's `preprocess`: subclassing gr.Image would
    make gradio write a .pyi stub beside this file."""
    component = gr.Image(type="filepath", image_mode=None, **kwargs)  # None: the file as uploaded, not decoded
    real = component.preprocess

    def preprocess(payload):
        name = Path(payload.orig_name).name if getattr(payload, "orig_name", None) else None
        shown = f'"{name}"' if name else "the uploaded file"
        try:
            path = real(payload)
        except gr.Error as e:
            raise gr.Error(user_message(str(e), None), title="Not a picture", print_exception=False) from None
        except Exception as e:  # PIL's UnidentifiedImageError, DecompressionBombError, OSError ...
            raise gr.Error(f"Could not read {shown} as a picture ({type(e).__name__}). "
                           "Please upload a PNG, JPEG, WebP, GIF or BMP image.", title="Not a picture",
                           print_exception=False) from None
        if path is None:
            return None
        check_pixels(path, shown)  # from the header: refused before anything decodes it
        return Upload(path, shown)

    component.preprocess = preprocess
    return component


def picture_size(path: Any) -> tuple[int, int] | None:
    """(width, height) from a picture file's header, without decoding it (PIL's Image.open is lazy); None
    when it is not a picture file (loading it then says why). Raises PIL's DecompressionBombError for one
    over PIL's own limit (twice its 89 megapixels)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                return im.size
    except Image.DecompressionBombError:
        raise
    except Exception:
        return None


def check_pixels(path: Any, shown: str = "the uploaded file") -> None:
    """A gr.Error when the header of picture `path` says it is over `vqa.data.images.MAX_PIXELS`: it is
    refused before anything decodes it."""
    limit = images.MAX_PIXELS
    try:
        size = picture_size(path)
        what = f"{shown} is {size[0]}x{size[1]} = {size[0] * size[1]:,} pixels," if size else ""
    except Image.DecompressionBombError:
        size, what = None, f"{shown} is"
    if what and (size is None or size[0] * size[1] > limit):
        raise gr.Error(f"{what} over the demo's limit of {limit:,} pixels. Please upload a smaller picture.",
                       title="Picture too large", print_exception=False)


def decoded_bytes(source: Any) -> int:
    """The memory picture file `source` takes decoded (DECODED_BYTES_PER_PIXEL per pixel of its header); 0 for
    what is not a picture file (loading it then says why)."""
    try:
        size = picture_size(source) if isinstance(source, (str, Path)) else None
    except Image.DecompressionBombError:
        size = None  # loading it refuses it
    return 0 if size is None else size[0] * size[1] * DECODED_BYTES_PER_PIXEL


class DecodeBudget:
    """Bounds the bytes of decoded pictures held at once by all requests: `with budget.hold(n):` waits until
    `n` more bytes fit in `max_bytes` (a picture larger than the whole budget waits until it is alone), at most
    `wait` seconds, then raises `Busy`. `peak` is the most bytes ever held at once."""

    def __init__(self, max_bytes: int = DECODE_BUDGET, wait: float = DECODE_WAIT):
        if max_bytes < 1:
            raise ValueError(f"the decode budget must be at least 1 byte, got {max_bytes}")
        self.max_bytes, self.wait = int(max_bytes), float(wait)
        self.held = self.peak = 0
        self._cond = threading.Condition()

    @contextmanager
    def hold(self, nbytes: int) -> Iterator[None]:
        n = int(nbytes)
        with self._cond:
            if not self._cond.wait_for(lambda: self.held == 0 or self.held + n <= self.max_bytes, self.wait):
                raise Busy("The demo is busy reading other large pictures. Please try again in a few seconds.")
            self.held += n
            self.peak = max(self.peak, self.held)
        try:
            yield
        finally:
            with self._cond:
                self.held -= n
                self._cond.notify_all()


DECODING = DecodeBudget()  # the demo's one budget, shared by every request of the process


def give_back_decoded_memory() -> None:
    """Make PIL allocate large pictures in PIL_BLOCK_SIZE blocks, so their memory goes back to the system when
    they are freed (unless PILLOW_BLOCK_SIZE says otherwise). Process-wide: the server calls it once."""
    if "PILLOW_BLOCK_SIZE" not in os.environ:
        Image.core.set_block_size(PIL_BLOCK_SIZE)


def _server_folders() -> list[str]:
    """Folders whose paths must never reach a user: gradio's upload cache and the temporary folder."""
    roots = {tempfile.gettempdir(), os.environ.get("GRADIO_TEMP_DIR", "")}
    return sorted((r for r in roots if r), key=len, reverse=True)


def user_message(text: str, image: Any) -> str:
    """`text` with the upload's server path replaced by the name the user gave the file (or "the uploaded
    file"), and any other path under the server's temporary folders too."""
    name = getattr(image, "display_name", None) or "the uploaded file"
    if isinstance(image, str) and image:
        text = text.replace(image, name)
    for root in _server_folders():
        text = re.sub(re.escape(root) + r"[^\s'\",;)]*", "the uploaded file", text)
    return text


def fail(e: Exception, image: Any = None) -> gr.Error:
    """The message shown for a VQAError (or a bad setting) about `image`: without server paths."""
    return gr.Error(user_message(str(e), image), title="Cannot do that", print_exception=False)
