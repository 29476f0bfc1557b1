"""The demo's picture input and what its messages say about uploads.

`Upload` is the server's path to an uploaded picture that remembers the name the user gave the file;
`picture_input` is the gr.Image that hands handlers an `Upload` and turns decoding failures into a message
naming the file; `user_message` rewrites any server path in a message to the user's name for the file.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import gradio as gr


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
    component = gr.Image(type="filepath", **kwargs)
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
        return None if path is None else Upload(path, shown)

    component.preprocess = preprocess
    return component


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
