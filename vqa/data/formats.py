"""The data set formats and the splits of a data folder: VQA v2 / OK-VQA (`vqa_v2`), COCO captions (`coco`), the
Karpathy split file (`karpathy`), TextVQA, VizWiz and GQA (`benchmarks`) and the project's JSONL schema (`jsonl`).

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

import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..errors import DataError
from .benchmarks import GQA, TEXTVQA, VIZWIZ, is_vizwiz, load_gqa, load_textvqa, load_vizwiz
from .coco import COCO_CAPTIONS, load_coco
from .jsonl import JSONL, load_jsonl
from .karpathy import KARPATHY, SPLITS, load_karpathy
from .records import CaptionBuilder, Strings, VQABuilder
from .split import ImageFinder, SplitData
from .vqa_v2 import VQA_QUESTIONS, load_vqa

_PATTERNS = (("vqa", VQA_QUESTIONS), ("coco", COCO_CAPTIONS), ("jsonl", JSONL), ("textvqa", TEXTVQA), ("gqa", GQA),
             ("vizwiz", VIZWIZ))


def _data_files(data_dir: Path) -> Iterator[tuple[str, str, Path]]:
    """(kind, split, path) of every data file at the top level of `data_dir` or under `annotations/` (VizWiz's
    `Annotations/` too); the Karpathy file gives one of each of its splits."""
    for folder in (data_dir, data_dir / "annotations", data_dir / "Annotations"):
        if not folder.is_dir():
            continue
        for p in sorted(folder.iterdir()):
            if not p.is_file():
                continue
            if KARPATHY.match(p.name):
                yield from (("karpathy", split, p) for split in SPLITS)
                continue
            for kind, pattern in _PATTERNS:
                m = pattern.match(p.name)
                if m and (kind != "vizwiz" or is_vizwiz(p)):
                    yield kind, m["split"], p
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


_BENCHMARKS = {"textvqa": load_textvqa, "vizwiz": load_vizwiz, "gqa": load_gqa}


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
        found = ", ".join(splits) if splits else ("none (expected VQA v2, COCO captions, Karpathy, TextVQA, VizWiz, GQA "
                                                  "or <split>.jsonl files)")
        raise DataError(f"{data_dir}: no split {split!r}; the splits found are: {found}")
    sd = SplitData(split=split, data_dir=data_dir)
    finder = ImageFinder(data_dir, split, check_images)
    vqa, caps = VQABuilder(sd.image_files, Strings()), CaptionBuilder(sd.image_files)
    for kind, s, path in _data_files(data_dir):
        if s != split:
            continue
        sd.files.append(path)
        if kind == "vqa":
            load_vqa(path, finder, sd, vqa, require_answers)
        elif kind == "coco":
            load_coco(path, finder, sd, caps)
        elif kind == "karpathy":
            load_karpathy(path, split, finder, sd, caps)
        elif kind in _BENCHMARKS:
            _BENCHMARKS[kind](path, split, finder, sd, vqa, require_answers)
        else:
            load_jsonl(path, sd, vqa, caps, check_images)
    sd.vqa, sd.captions = vqa.freeze(), caps.freeze()
    if not len(sd.vqa) and not len(sd.captions):
        raise DataError(f"{data_dir}: split {split!r} has no usable records ({sd.report()})")
    if sd.skipped and not quiet:
        print(f"warning: {sd.report()}", file=sys.stderr)
    return sd


TOKENIZER_SAMPLES = 200_000  # questions + captions a tokenizer is trained on at most (as for streamed shards)


def corpus_texts(split_data: SplitData | Iterable[SplitData], limit: int | None = TOKENIZER_SAMPLES) -> Iterator[str]:
    """The text a tokenizer should be trained on: questions, their distinct answers, captions. Beyond `limit`
    questions + captions, an even sample of them (every k-th question with its answers, every k-th caption):
    VQA v2's 858k take a fifth of the time to train on, and a BPE vocabulary is settled long before."""
    parts = [split_data] if isinstance(split_data, SplitData) else list(split_data)
    total = sum(len(sd.vqa.question) + len(sd.captions.caption) for sd in parts)
    step = 1 if limit is None or total <= limit else -(-total // limit)  # ceil
    for sd in parts:
        t = sd.vqa
        s = t.strings.items
        empty = t.strings.id("")
        starts = t.ans_start.tolist()
        answers = t.answers.tolist()
        for i, q in enumerate(t.question.tolist()[::step]):
            i *= step
            yield s[q]
            yield from (s[a] for a in dict.fromkeys(answers[starts[i] : starts[i + 1]]) if a != empty)
        yield from sd.captions.caption[::step]


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


__all__ = ["find_splits", "pick_split", "load_split", "corpus_texts", "corpus_batches"]
