"""COCO captions: `captions_<split>.json` (its `images` and `annotations`), at the top level of the data
folder or under `annotations/`. Empty captions, captions of an unknown image id and captions of a missing
image are counted in `SplitData.skipped`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec

from ..records import CaptionBuilder
from ..split import ImageFinder, SplitData
from .json_fields import decode_fast, get_list, read_bytes, read_json, required

COCO_CAPTIONS = re.compile(r"^captions_(?P<split>.+)\.json$")


class _CocoImage(msgspec.Struct, gc=False):
    id: int | str
    file_name: str


class _CocoCaption(msgspec.Struct, gc=False):
    image_id: int | str
    caption: str
    id: Any = None


class _Coco(msgspec.Struct):
    images: list[_CocoImage]
    annotations: list[_CocoCaption]


_COCO = msgspec.json.Decoder(_Coco)


def _read_coco(path: Path) -> _Coco:
    fast = decode_fast(read_bytes(path), _COCO)
    if fast is not None:
        return fast
    data = read_json(path)
    images = get_list(data, "images", path, "COCO captions")
    annotations = get_list(data, "annotations", path, "COCO captions")
    out = _Coco([], [])
    for i, im in enumerate(images):
        where = f"{path}: images[{i}]"
        out.images.append(_CocoImage(required(im, "id", (int, str), where), required(im, "file_name", str, where)))
    for i, a in enumerate(annotations):
        where = f"{path}: annotations[{i}]"
        out.annotations.append(_CocoCaption(required(a, "image_id", (int, str), where),
                                            required(a, "caption", str, where), a.get("id")))
    return out


def load_coco(path: Path, finder: ImageFinder, split_data: SplitData, out: CaptionBuilder) -> None:
    data = _read_coco(path)
    files = {im.id: im.file_name for im in data.images}
    resolved: dict[Any, int | None] = {}
    for a in data.annotations:
        caption = " ".join(a.caption.split())
        if not caption:
            split_data.skipped["empty caption"] += 1
            continue
        if a.image_id not in files:
            split_data.skipped["caption of an image id not in 'images'"] += 1
            continue
        if a.image_id not in resolved:
            path_ = finder.file(files[a.image_id])
            resolved[a.image_id] = None if path_ is None else split_data.image_files.id(path_)
        if resolved[a.image_id] is None:
            split_data.skipped["caption with a missing image"] += 1
            continue
        out.add(resolved[a.image_id], caption, a.image_id, a.id)
