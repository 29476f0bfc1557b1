"""The data set formats of a folder, in one table (`FORMATS`): the file names each is found by and its reader.
VQA v2 / OK-VQA (`vqa_v2`), COCO captions (`coco`), the Karpathy split file (`karpathy`), TextVQA, VizWiz and GQA
(`benchmarks`) and the project's JSONL schema (`jsonl`); shards (webdataset tars, parquet) are `shards`.

A data set is a folder; its splits are found from the file names (see `find_splits`), and one split may mix
formats (the Shapes set has VQA v2 questions and COCO captions for the same images). Every reader turns its
files into compact columnar records (`vqa.data.records`), so the torch datasets never see a format. The
official files are parsed with msgspec into typed structs; when that fails, the file is read again with the
standard library to say exactly where. Bad files raise DataError naming the file and the line (or array
position) and field; recoverable problems (a missing image, a question without an annotation, an empty
question or caption in an official file) are counted in `SplitData.skipped` and reported, never silently
dropped.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ...errors import DataError
from ..records import CaptionBuilder, Strings, VQABuilder
from ..split import ImageFinder, SplitData
from .benchmarks import GQA, TEXTVQA, VIZWIZ, is_vizwiz, load_gqa, load_textvqa, load_vizwiz
from .coco import COCO_CAPTIONS, load_coco
from .jsonl import JSONL, load_jsonl
from .karpathy import KARPATHY, SPLITS, load_karpathy
from .vqa_v2 import VQA_QUESTIONS, load_vqa


@dataclass(frozen=True)
class FileToRead:
    """What a reader is given: one file of the split being read, and the builders its records go to."""

    path: Path
    split: str
    finder: ImageFinder
    split_data: SplitData
    vqa: VQABuilder
    caps: CaptionBuilder
    require_answers: bool
    check_images: bool


@dataclass(frozen=True)
class Format:
    """A data set format: the file name it is found by (the pattern's `split` group names the split) and the
    reader of one such file."""

    name: str
    pattern: re.Pattern
    read: Callable[[FileToRead], None]
    splits: tuple[str, ...] = ()  # a file that holds these splits, whatever its name (Karpathy's)
    accepts: Callable[[Path], bool] | None = None  # a further check of a common file name (VizWiz's train.json)


# a file is of the first format whose pattern matches its name (and that accepts it)
FORMATS = (
    Format("karpathy", KARPATHY, lambda f: load_karpathy(f.path, f.split, f.finder, f.split_data, f.caps),
           splits=tuple(SPLITS)),
    Format("vqa_v2", VQA_QUESTIONS,
           lambda f: load_vqa(f.path, f.finder, f.split_data, f.vqa, f.require_answers)),
    Format("coco", COCO_CAPTIONS, lambda f: load_coco(f.path, f.finder, f.split_data, f.caps)),
    Format("jsonl", JSONL, lambda f: load_jsonl(f.path, f.split_data, f.vqa, f.caps, f.check_images)),
    Format("textvqa", TEXTVQA,
           lambda f: load_textvqa(f.path, f.split, f.finder, f.split_data, f.vqa, f.require_answers)),
    Format("gqa", GQA, lambda f: load_gqa(f.path, f.split, f.finder, f.split_data, f.vqa, f.require_answers)),
    Format("vizwiz", VIZWIZ,
           lambda f: load_vizwiz(f.path, f.split, f.finder, f.split_data, f.vqa, f.require_answers),
           accepts=is_vizwiz),
)


def _data_files(data_dir: Path) -> Iterator[tuple[Format, str, Path]]:
    """(format, split, path) of every data file at the top level of `data_dir` or under `annotations/`
    (VizWiz's `Annotations/` too); a file that holds several splits (Karpathy's) gives one of each."""
    for folder in (data_dir, data_dir / "annotations", data_dir / "Annotations"):
        if not folder.is_dir():
            continue
        for p in sorted(folder.iterdir()):
            if not p.is_file():
                continue
            for fmt in FORMATS:
                m = fmt.pattern.match(p.name)
                if m and (fmt.accepts is None or fmt.accepts(p)):
                    yield from ((fmt, split, p) for split in fmt.splits or (m["split"],))
                    break


def find_splits(data_dir: str | Path) -> list[str]:
    """The splits of a data folder, from its file names: `v2_OpenEnded_mscoco_<split>_questions.json`
    (or OK-VQA's `OpenEnded_mscoco_<split>_questions.json`), `captions_<split>.json` (top level or under
    `annotations/`), `<split>.jsonl`, `dataset_coco.json` (train, val, test), `TextVQA_0.5.1_<split>.json`,
    VizWiz's `Annotations/<split>.json` and GQA's `<split>_balanced_questions.json`."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DataError(f"{data_dir}: no such data folder")
    return sorted({split for _, split, _ in _data_files(data_dir)})


def pick_split(splits: list[str], role: str, where: str, flag: str) -> str | None:
    """The split to use as `role` ("train" or "val") when the user named none: the one called `role`, else
    the only one whose name starts with it (train2014, train2017, val2014, validation). None when there is
    none; DataError naming the candidates and the flag that chooses when several fit."""
    if role in splits:
        return role
    fits = [s for s in splits if s.startswith(role)]
    if len(fits) == 1:
        return fits[0]
    if fits:
        raise DataError(f"{where}: several splits could be the {role} split ({', '.join(fits)}); choose one with "
                        f"{flag} (the splits found are: {', '.join(splits)})")
    return None


def load_split(
    data_dir: str | Path,
    split: str,
    check_images: bool = True,
    require_answers: bool = True,
    quiet: bool = False,
) -> SplitData:
    """Every record of `split` in `data_dir`, from all formats present.

    check_images: skip (and count) records whose image file does not exist; decoding is checked later, when
    an image is loaded (or by `vqa data info --check-images`). require_answers=False keeps questions that have
    no annotation (e.g. a test split) with `answers=[]` instead of skipping them."""
    data_dir = Path(data_dir)
    splits = find_splits(data_dir)
    if split not in splits:
        found = ", ".join(splits) if splits else ("none (expected VQA v2, COCO captions, Karpathy, TextVQA, "
                                                  "VizWiz, GQA or <split>.jsonl files)")
        raise DataError(f"{data_dir}: no split {split!r}; the splits found are: {found}")
    split_data = SplitData(split=split, data_dir=data_dir)
    finder = ImageFinder(data_dir, split, check_images)
    vqa, caps = VQABuilder(split_data.image_files, Strings()), CaptionBuilder(split_data.image_files)
    for fmt, s, path in _data_files(data_dir):
        if s != split:
            continue
        split_data.files.append(path)
        fmt.read(FileToRead(path, split, finder, split_data, vqa, caps, require_answers, check_images))
        split_data.vqa_formats.append((fmt.name, len(vqa.question)))
    split_data.vqa, split_data.captions = vqa.freeze(), caps.freeze()
    if not len(split_data.vqa) and not len(split_data.captions):
        raise DataError(f"{data_dir}: split {split!r} has no usable records ({split_data.report()})")
    if split_data.skipped and not quiet:
        print(f"warning: {split_data.report()}", file=sys.stderr)
    return split_data


__all__ = ["FORMATS", "Format", "find_splits", "pick_split", "load_split"]
