"""Pictures, folders of them and tar shards for the collection tests (tests/test_collect*.py)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from predict_fixtures import draw

NAMES = ["red_circle", "blue_square"]


def png(name: str, size: tuple[int, int]) -> bytes:
    """The picture `name` with a dark mark in its top-left corner (so that a flipped or transposed input shows)."""
    img = draw(name, size)
    img.paste((20, 20, 20), (1, 1, 7, 5))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def photo_folder(root: Path, n: int = 12) -> list[Path]:
    """`n` pictures of both kinds at odd sizes, a third of them in a sub-folder; their paths in walk order."""
    top, sub = [], []
    for i in range(n):
        p = root / ("deeper" if i % 3 == 0 else "") / f"{i:03d}.png"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(png(NAMES[i % 2], (32 + i, 40 + 2 * (i % 5))))
        (sub if i % 3 == 0 else top).append(p)
    return top + sub  # a folder's files come before its sub-folders'


def kind(p: Path) -> tuple[str, str]:
    """(colour, shape) drawn in photo_folder's picture `p`."""
    return ("red", "circle") if int(p.stem) % 2 == 0 else ("blue", "square")


def write_tar(path: Path, samples: dict[str, bytes], ext: str = "png") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as t:
        for key, data in samples.items():
            for name, blob in ((f"{key}.{ext}", data), (f"{key}.txt", b"a caption")):
                info = tarfile.TarInfo(name)
                info.size = len(blob)
                t.addfile(info, io.BytesIO(blob))
    return path


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]
