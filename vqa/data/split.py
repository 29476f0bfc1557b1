"""One split of a data folder: its records and what was skipped while reading them (`SplitData`), where its
image files are (`ImageFinder`), and the text a tokenizer is trained on (`corpus_texts`)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .records import CaptionTable, Images, VQATable

IMAGE_EXTS = (".jpg", ".png", ".jpeg", ".JPG", ".PNG", ".JPEG")


@dataclass
class SplitData:
    """The records of one split, and what was skipped while reading it (reason -> count).

    `vqa` and `captions` are compact columnar tables (see `vqa.data.records`); lists of records given to the
    constructor are turned into tables."""

    split: str
    data_dir: Path
    vqa: VQATable | list = field(default_factory=list)
    captions: CaptionTable | list = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)
    files: list[Path] = field(default_factory=list)
    image_files: Images = field(default_factory=Images)
    # (format name, end): the VQA rows before `end` and after the previous entry's came from a file of that
    # format (`readers.formats.FORMATS`), which says whose rules score them (`vqa.evaluation.answer_rules`)
    vqa_formats: list[tuple[str, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.vqa, VQATable):
            self.vqa = VQATable.from_records(self.vqa, self.image_files)
        if not isinstance(self.captions, CaptionTable):
            self.captions = CaptionTable.from_records(self.captions, self.image_files)

    def images(self) -> set[Path]:
        used = np.union1d(self.vqa.image, self.captions.image)
        return {Path(self.image_files.paths[i]) for i in used.tolist()}

    def report(self) -> str:
        qi = len(np.unique(self.vqa.image))
        ci = len(np.unique(self.captions.image))
        files = ", ".join(str(f.relative_to(self.data_dir)) for f in self.files)
        text = (
            f"{self.split}: {len(self.vqa)} questions on {qi} images, {len(self.captions)} captions on {ci} images"
            f" (from {files or 'no files'})"
        )
        if self.skipped:
            text += f"; skipped {sum(self.skipped.values())}: " + skipped_summary(self.skipped)
        return text


def skipped_summary(skipped: Counter) -> str:
    return ", ".join(f"{n} {reason}" for reason, n in sorted(skipped.items(), key=lambda kv: (-kv[1], kv[0])))


class ImageFinder:
    """Resolves image files of a split, listing each candidate folder once (fast on 100k-image folders)."""

    def __init__(self, data_dir: Path, split: str, check: bool):
        self.split, self.check = split, check
        cands = [data_dir / split, data_dir / f"{split}2014", data_dir / "images" / split, data_dir / "images"]
        self.dirs = [d for d in cands if d.is_dir()]
        self.default_dir = self.dirs[0] if self.dirs else data_dir / split
        self._names: dict[Path, set[str]] = {}

    def _listing(self, d: Path) -> set[str]:
        if d not in self._names:
            self._names[d] = set(os.listdir(d))
        return self._names[d]

    def vqa(self, image_id: int | str) -> Path | None:
        """`<split>/COCO_<split>_<12-digit id>.<ext>`, with whichever extension exists."""
        stem = f"{int(image_id):012d}" if str(image_id).isdigit() else str(image_id)
        for d in self.dirs:
            names = self._listing(d)
            for prefix in dict.fromkeys((f"COCO_{d.name}_", f"COCO_{self.split}_")):
                for ext in IMAGE_EXTS:
                    if prefix + stem + ext in names:
                        return d / (prefix + stem + ext)
        return None if self.check else self.default_dir / f"COCO_{self.split}_{stem}.jpg"

    def named(self, name: str, folders: list[Path]) -> Path | None:
        """`<folder>/<name>` in the first of `folders` that holds it (the benchmarks' own image folders)."""
        for d in folders:
            if d.is_dir() and (("/" in name and (d / name).is_file()) or name in self._listing(d)):
                return d / name
        return None if self.check else folders[0] / name

    def file(self, file_name: str) -> Path | None:
        """`<split>/<file_name>` (or `<split>2014/`, `images/<split>/`, `images/`)."""
        for d in self.dirs:
            if ("/" in file_name and (d / file_name).is_file()) or file_name in self._listing(d):
                return d / file_name
        return None if self.check else self.default_dir / file_name


TOKENIZER_SAMPLES = 200_000  # questions + captions a tokenizer is trained on at most (as for streamed shards)


def corpus_texts(split_data: SplitData | Iterable[SplitData], limit: int | None = TOKENIZER_SAMPLES) -> Iterator[str]:
    """The text a tokenizer should be trained on: questions, their distinct answers, captions. Beyond `limit`
    questions + captions, an even sample of them (every k-th question with its answers, every k-th caption):
    VQA v2's 858k take a fifth of the time to train on, and a BPE vocabulary is settled long before."""
    parts = [split_data] if isinstance(split_data, SplitData) else list(split_data)
    total = sum(len(part.vqa.question) + len(part.captions.caption) for part in parts)
    step = 1 if limit is None or total <= limit else -(-total // limit)  # ceil
    for part in parts:
        t = part.vqa
        s = t.strings.items
        empty = t.strings.id("")
        starts = t.ans_start.tolist()
        answers = t.answers.tolist()
        for i, q in enumerate(t.question.tolist()[::step]):
            i *= step
            yield s[q]
            yield from (s[a] for a in dict.fromkeys(answers[starts[i] : starts[i + 1]]) if a != empty)
        yield from part.captions.caption[::step]


def corpus_batches(split_data: SplitData | Iterable[SplitData], size: int = 4096) -> Iterator[list[str]]:
    """`corpus_texts` in lists of `size`: the tokenizer's trainer takes them without a Python call per text."""
    batch: list[str] = []
    for text in corpus_texts(split_data):
        batch.append(text)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
