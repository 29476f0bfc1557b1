"""What `vqa caption` / `vqa ask` run over: their INPUTs expanded into one sequence of positions, each one image
(and, for `vqa ask`, one question), before any work starts.

An INPUT is an image file; a folder (walked recursively: its image files by extension, its .tar shards and
the .parquet shards that are not img2dataset's metadata twin of a .tar); a glob (`photos/**/*.jpg`: what it
matches, by the same rules as a folder's files, a matched folder walked as one); a text
file of image paths (.txt / .lst / .list: one a line, relative to the file's folder, `#` comments); or shards
read by the training reader (`vqa.data.readers.shards.ShardSplit`): a .tar / .parquet file, a brace pattern
(`shards/{00000..00099}.tar`) or a URL. A shard counts its samples up front (img2dataset's NNNNN_stats.json,
parquet metadata, or a scan), so every position is known before reading, which is what dealing them to
ranks and DataLoader workers needs (`vqa.inference.collection.loader`).

What stops before any work, with one line: an INPUT that names nothing (a missing path, an empty folder, a
glob that matches nothing), a missing or unreadable shard, a malformed line of a questions file. What does
not: an image path that turns out unreadable, truncated, huge or not an image (its record says so).

Keys: a file's `image` is its path as reached from the INPUT (`photos/a/b.jpg`); a shard sample's is its key
within the shard, with the shard's url beside it. The same file reached twice (a folder and a glob), or a
questions file's line repeated (the same image, question and question_id), is one position: the first, so
one record (a rerun resumes by record). `Collection.repeats` keeps where the repeats were, and the command
says how many it skipped.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ...data.readers.jsonl import json_objects, text_field
from ...data.readers.shards import SHARD_EXTS, ShardSplit
from ...data.sources import is_pattern
from ...errors import DataError, InputError

IMAGE_EXTS = {".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff", ".ppm",
              ".pgm", ".pbm", ".pnm", ".tga", ".ico", ".avif"}
LIST_EXTS = {".txt", ".lst", ".list"}


@dataclass(frozen=True)
class FileItem:
    """One image file (with the question about it, for `vqa ask`): one position."""

    key: str  # what the record's `image` says
    path: str  # where to read it
    question: str | None = None
    question_id: object = None
    where: str | None = field(default=None, compare=False)  # a questions file's "line N" (a repeat names it)

    n = 1


@dataclass(frozen=True)
class ShardItems:
    """Shard number `index` of `split`: `n` positions, one a sample, each asked `question` (if any)."""

    split: ShardSplit
    index: int
    question: str | None = None

    @property
    def n(self) -> int:
        return self.split.shards[self.index].n

    @property
    def url(self) -> str:
        return self.split.shards[self.index].url


Unit = FileItem | ShardItems


@dataclass
class Collection:
    units: list[Unit]
    repeats: list[str] = field(default_factory=list)  # the inputs skipped as repeats ("line 5 repeats line 2")

    def __len__(self) -> int:
        return sum(u.n for u in self.units)

    def starts(self) -> list[int]:
        """The first position of each unit."""
        return list(itertools.accumulate((u.n for u in self.units[:-1]), initial=0)) if self.units else []

    def describe(self) -> str:
        files = sum(1 for u in self.units if isinstance(u, FileItem))
        shards = [u for u in self.units if isinstance(u, ShardItems)]
        parts = [f"{files} image file{'s' * (files != 1)}"] if files else []
        if shards:
            parts.append(f"{sum(u.n for u in shards)} samples in {len(shards)} shard{'s' * (len(shards) != 1)}")
        return " and ".join(parts) or "nothing"

    def describe_repeats(self) -> str | None:
        """What was skipped as a repeat, in a sentence (None: nothing)."""
        if not self.repeats:
            return None
        n = len(self.repeats)
        return (f"skipped {n} repeated input{'s' * (n != 1)} (the first: {self.repeats[0]}): one record per "
                "image and question")


def _is_glob(s: str) -> bool:
    return any(c in s for c in "*?[")


def _pick(files: list[Path]) -> tuple[list[Path], list[str]]:
    """(image files, shard files) among `files`, in their order, by the folder rules: images by extension,
    .tar shards, and the .parquet shards that are not img2dataset's metadata twin of a .tar beside them."""
    images, shards = [], []
    for p in files:
        ext = p.suffix.lower()
        if ext in IMAGE_EXTS:
            images.append(p)
        elif ext == ".tar" or (ext == ".parquet" and not p.with_suffix(".tar").is_file()):
            shards.append(str(p))
    return images, shards


def _folder(root: Path) -> list[Path]:
    """The files under `root`, recursively, sorted; hidden files and folders skipped."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        out += [Path(dirpath) / f for f in sorted(filenames) if not f.startswith(".")]
    return out


def _glob(pattern: str) -> list[Path]:
    """The files a glob matches, in sorted order, a matched folder walked; `_pick` then keeps a matched file only
    as a folder's file would be kept (a notes.txt, a metadata .parquet: not inputs)."""
    out = []
    for m in sorted(glob.glob(pattern, recursive=True)):
        out += _folder(Path(m)) if Path(m).is_dir() else [Path(m)]
    return out


def _list_file(path: Path) -> list[Path]:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read the list of images ({e})") from None
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            p = Path(line)
            out.append(p if p.is_absolute() else path.parent / p)
    if not out:
        raise InputError(f"{path}: the list of images is empty")
    return out


def _shards(name: str, urls: list[str], question: str | None) -> list[ShardItems]:
    split = ShardSplit.from_urls(name, name, urls)  # missing shards -> DataError; counts the samples
    return [ShardItems(split, j, question) for j in range(len(split.shards))]


def expand(inputs: list[str], question: str | None = None) -> Collection:
    """The positions of `inputs` in order (see the module docstring); `question` is asked of every image."""
    if not inputs:
        raise InputError("no INPUT given: name images, folders, globs, lists of paths or shards")
    units: list[Unit] = []

    def add_file(p: Path) -> None:
        units.append(FileItem(str(p), str(p), question))

    def add_found(raw: str, files: list[Path], what: str) -> None:
        """A folder's or a glob's images and shards (`_pick`), or InputError when there are none."""
        images, shards = _pick(files)
        if not images and not shards:
            raise InputError(f"{raw}: {what} no images (by extension: {', '.join(sorted(IMAGE_EXTS)[:6])}, ...) "
                             "and no .tar / .parquet shards")
        for f in images:
            add_file(f)
        if shards:
            units.extend(_shards(raw, shards, question))

    for raw in inputs:
        p = Path(raw)
        if p.is_dir():
            add_found(raw, _folder(p), "the folder holds")
        elif p.is_file():
            ext = p.suffix.lower()
            if ext in SHARD_EXTS:
                units += _shards(raw, [raw], question)
            elif ext in LIST_EXTS:
                for f in _list_file(p):
                    add_file(f)
            else:
                add_file(p)  # an image, or a file whose record will say why it is not one
        elif is_pattern(raw) and not _is_glob(raw):
            split = ShardSplit.from_pattern(raw, raw)
            units += [ShardItems(split, j, question) for j in range(len(split.shards))]
        elif _is_glob(raw):
            if not glob.glob(raw, recursive=True):
                raise InputError(f"{raw}: the pattern matches no files")
            add_found(raw, _glob(raw), "the pattern matches")
        else:
            raise InputError(f"{raw}: no such file, folder or shard")
    return _distinct(units)


def _distinct(units: list[Unit]) -> Collection:
    """The units with every repeat of a file (and question) left out: kept in `repeats`, never silently."""
    first: dict[tuple, FileItem] = {}
    out, repeats = [], []
    for u in units:
        if isinstance(u, FileItem):
            k = (os.path.normpath(u.path), u.question, u.question_id)
            if k in first:
                was = first[k]
                repeats.append(f"{u.where} repeats {was.where}" if u.where else f"{u.key} again")
                continue
            first[k] = u
        out.append(u)
    return Collection(out, repeats)


def read_questions(path: str | Path) -> Collection:
    """A questions file: one JSON object a line, {"image": path relative to the file, "question": text} and an
    optional "question_id". A malformed line is a DataError naming the file, line and field."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such questions file")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read ({e})") from None
    units: list[Unit] = []
    for lineno, where, obj in json_objects(text, path):
        text_field(obj, "image", where)  # a non-empty string (kept as given: it is a path)
        question = text_field(obj, "question", where)
        qid = obj.get("question_id")
        if qid is not None and (isinstance(qid, bool) or not isinstance(qid, (str, int))):
            raise DataError(f"{where}: field 'question_id' must be a string or an integer, got {json.dumps(qid)[:60]}")
        image = Path(obj["image"])
        units.append(FileItem(obj["image"], str(image if image.is_absolute() else path.parent / image),
                              question, qid, where=f"line {lineno}"))
    if not units:
        raise DataError(f"{path}: no questions in the file")
    return _distinct(units)


__all__ = ["Collection", "FileItem", "ShardItems", "expand", "read_questions", "IMAGE_EXTS"]
