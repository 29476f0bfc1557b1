"""A things folder: pictures of real kinds of things (a dog, a bus, a tree) that `vqa pretrain --things DIR`
draws into part of the corpus, so the towers see shading and texture and learn those words.

DIR/things.json is {"sources": [...], "things": [{"file": "PATH.png", "name": "dog"}, ...]}: each file (relative
to DIR) a picture on a transparent background, each name one lower-case word (a caption and the grounding loss
name an object by one noun). Several files may share a name (the same thing by other artists).
`scripts/make_things.py` makes one from Debian's emoji packages (docs/pretraining.md).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from ...errors import ConfigError, DataError

NAME = re.compile(r"[a-z][a-z-]*[a-z]")
MIN_NAMES = 2  # "is there a X?" needs a thing that is not there


@dataclass(frozen=True)
class Things:
    folder: Path
    files: dict[str, tuple[str, ...]]  # name -> its pictures' files, relative to the folder
    digest: str  # sha256 of things.json: a corpus records which things it drew

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self.files))


@functools.lru_cache(maxsize=4)
def load(folder: str) -> Things:
    """The things folder's index, every file checked; one-line errors that name the file and the entry."""
    root = Path(folder)
    index = root / "things.json"
    if not index.is_file():
        raise ConfigError(f"--things {folder}: no things.json there (make one with scripts/make_things.py)")
    raw = index.read_bytes()
    try:
        doc = json.loads(raw)
        entries = doc["things"]
        assert isinstance(entries, list)
    except (ValueError, KeyError, TypeError, AssertionError) as e:
        raise DataError(f"{index}: not a things index ({{\"things\": [{{\"file\", \"name\"}}]}}): {e}") from None
    files: dict[str, list[str]] = {}
    for k, e in enumerate(entries):
        if not isinstance(e, dict) or not isinstance(e.get("file"), str) or not isinstance(e.get("name"), str):
            raise DataError(f"{index}: things[{k}] needs a \"file\" and a \"name\" (strings)")
        if not NAME.fullmatch(e["name"]):
            raise DataError(f"{index}: things[{k}] name {e['name']!r} is not one lower-case word")
        if not (root / e["file"]).is_file():
            raise DataError(f"{index}: things[{k}] file {e['file']} is missing")
        files.setdefault(e["name"], []).append(e["file"])
    if len(files) < MIN_NAMES:
        raise DataError(f"{index}: {len(files)} names; a things folder needs at least {MIN_NAMES}")
    return Things(root, {n: tuple(f) for n, f in sorted(files.items())}, hashlib.sha256(raw).hexdigest())


@functools.lru_cache(maxsize=4096)
def picture(folder: str, file: str) -> Image.Image:
    """The thing's picture as RGBA, cropped to its opaque pixels (a one-line error for an unreadable file)."""
    path = Path(folder) / file
    try:
        with Image.open(path) as im:
            im = im.convert("RGBA")
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: not a readable picture ({e})") from None
    box = Image.fromarray((np.asarray(im)[..., 3] > 127).astype(np.uint8) * 255).getbbox()
    if box is None:
        raise DataError(f"{path}: the picture is fully transparent")
    return im.crop(box)


__all__ = ["Things", "load", "picture"]
