"""The Karpathy split file (`dataset_coco.json`, also `dataset_flickr8k.json` / `dataset_flickr30k.json`):
every image with its split and its sentences, the split on which captioning papers report.

    {"images": [{"filepath": "val2014", "filename": "COCO_val2014_000000391895.jpg", "imgid": 0,
                 "split": "test", "cocoid": 391895,
                 "sentences": [{"raw": "A man with a red helmet ...", "tokens": [...], "sentid": 770337}]}],
     "dataset": "coco"}

It gives the data folder the splits `train` (Karpathy's train and restval: the 113,287 COCO images papers
train on), `val` and `test` (5,000 images each for COCO). An image is `<filepath>/<filename>` (Flickr's files
have no filepath: `<filename>` under `images/` or the folder itself); its id is `cocoid`, else `imgid`; a
caption is its sentence's `raw` text, its id `sentid`. Empty sentences and missing images are counted in
`SplitData.skipped`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec

from ..records import CaptionBuilder
from ..split import ImageFinder, SplitData
from .json_fields import read_list, required

KARPATHY = re.compile(r"^dataset_(?P<name>[A-Za-z0-9]+)\.json$")
SPLITS = {"train": ("train", "restval"), "val": ("val",), "test": ("test",)}  # data folder split -> Karpathy's


class _Sentence(msgspec.Struct, gc=False):
    raw: str
    sentid: Any = None


class _Image(msgspec.Struct):
    filename: str
    split: str
    sentences: list[_Sentence]
    filepath: str = ""
    cocoid: Any = None
    imgid: Any = None


class _Karpathy(msgspec.Struct):
    images: list[_Image]


_KARPATHY = msgspec.json.Decoder(_Karpathy)


def _image(im, where: str) -> _Image:
    sentences = [_Sentence(required(s, "raw", str, f"{where}.sentences[{j}]"), s.get("sentid"))
                 for j, s in enumerate(required(im, "sentences", list, where))]
    return _Image(required(im, "filename", str, where), required(im, "split", str, where), sentences,
                  im.get("filepath") or "", im.get("cocoid"), im.get("imgid"))


def load_karpathy(path: Path, split: str, finder: ImageFinder, split_data: SplitData,
                  out: CaptionBuilder) -> None:
    root, wanted = split_data.data_dir, SPLITS[split]
    for im in read_list(path, _KARPATHY, "images", "Karpathy split", _image):
        if im.split not in wanted:
            continue
        folders = [root / im.filepath, root / "images" / im.filepath] if im.filepath else [root / "images", root]
        image_id = im.cocoid if im.cocoid is not None else im.imgid
        image = finder.named(im.filename, folders)
        index = None if image is None else split_data.image_files.id(image)
        for s in im.sentences:
            caption = " ".join(s.raw.split())
            if not caption:
                split_data.skipped["empty caption"] += 1
            elif index is None:
                split_data.skipped["caption with a missing image"] += 1
            else:
                out.add(index, caption, image_id, s.sentid)
