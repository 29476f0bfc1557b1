"""Readers for the data set formats: VQA v2 / OK-VQA, COCO captions and the project's JSONL schema.

A data set is a folder; its splits are found from the file names (see `find_splits`), and one split may mix
formats (the Shapes set has VQA v2 questions and COCO captions for the same images). Every reader turns its
files into compact columnar records (`vqa.data.records`), so the torch datasets never see a format. The
official files are parsed with msgspec into typed structs (a VQA v2 annotations file of 443,757 questions in a
few seconds, without a Python dict per answer); when that fails, the file is read again with the standard
library to say exactly where. Bad files raise DataError naming the file and the line (or array position) and
field; recoverable problems (a missing image, a question without an
annotation, an empty question or caption in an official file) are counted in `SplitData.skipped` and
reported, never silently dropped. A VQA v2 record keeps all its annotators' answers, empty ones included, as
the official evaluation scores against them; training samples among the non-empty ones.
"""

from __future__ import annotations

import json
import os
import re
import sys
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ..errors import DataError
from .records import (
    CaptionBuilder,
    CaptionRecord,
    CaptionTable,
    Images,
    Strings,
    VQABuilder,
    VQARecord,
    VQATable,
)

VQA_QUESTIONS = re.compile(r"^(?P<v2>v2_)?OpenEnded_mscoco_(?P<split>.+)_questions\.json$")
COCO_CAPTIONS = re.compile(r"^captions_(?P<split>.+)\.json$")
JSONL = re.compile(r"^(?P<split>.+)\.jsonl$")
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


# ---------------------------------------------------------------------------------------------------------
# splits


def _data_files(data_dir: Path) -> Iterator[tuple[str, str, Path]]:
    """(kind, split, path) of every data file at the top level of `data_dir` or under `annotations/`."""
    for folder in (data_dir, data_dir / "annotations"):
        if not folder.is_dir():
            continue
        for p in sorted(folder.iterdir()):
            if not p.is_file():
                continue
            for kind, pattern in (("vqa", VQA_QUESTIONS), ("coco", COCO_CAPTIONS), ("jsonl", JSONL)):
                m = pattern.match(p.name)
                if m:
                    yield kind, m["split"], p
                    break


def find_splits(data_dir: str | Path) -> list[str]:
    """The splits of a data folder, from its file names: `v2_OpenEnded_mscoco_<split>_questions.json`
    (or OK-VQA's `OpenEnded_mscoco_<split>_questions.json`), `captions_<split>.json` (top level or under
    `annotations/`) and `<split>.jsonl`."""
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
        found = ", ".join(splits) if splits else "none (expected VQA v2, COCO captions or <split>.jsonl files)"
        raise DataError(f"{data_dir}: no split {split!r}; the splits found are: {found}")
    sd = SplitData(split=split, data_dir=data_dir)
    finder = _ImageFinder(data_dir, split, check_images)
    vqa, caps = VQABuilder(sd.image_files, Strings()), CaptionBuilder(sd.image_files)
    for kind, s, path in _data_files(data_dir):
        if s != split:
            continue
        sd.files.append(path)
        if kind == "vqa":
            _load_vqa(path, finder, sd, vqa, require_answers)
        elif kind == "coco":
            _load_coco(path, finder, sd, caps)
        else:
            _load_jsonl(path, sd, vqa, caps, check_images)
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


# ---------------------------------------------------------------------------------------------------------
# reading files


def _decode(path: Path, raw: bytes) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        col = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise DataError(
            f"{path}:{line}:{col}: not valid UTF-8 (byte 0x{raw[e.start]:02x}); save the file as UTF-8"
        ) from None


def _read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror or e})") from None
    return raw[3:] if raw.startswith(b"\xef\xbb\xbf") else raw


def read_json(path: Path) -> Any:
    """Parsed JSON; malformed JSON or non-UTF-8 bytes -> DataError with the file, line and column."""
    raw = _read_bytes(path)
    try:
        return json.loads(_decode(path, raw))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}:{e.colno}: malformed JSON: {e.msg}") from None


_FAST_ERRORS = (msgspec.MsgspecError, UnicodeDecodeError, ValueError)


def _fast(raw: bytes | msgspec.Raw, decoder: msgspec.json.Decoder) -> Any:
    """The typed decode, or None when it fails (the caller then reads the slow way to say where)."""
    try:
        return decoder.decode(raw)
    except _FAST_ERRORS:
        return None


def _get_list(obj: Any, key: str, path: Path, fmt: str) -> list:
    if not isinstance(obj, dict) or not isinstance(obj.get(key), list):
        raise DataError(f"{path}: expected a JSON object with a {key!r} list ({fmt} format)")
    return obj[key]


def _req(obj: Any, key: str, types: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if key not in obj:
        raise DataError(f"{where}: missing field {key!r}")
    v = obj[key]
    if not isinstance(v, types) or isinstance(v, bool):
        names = types.__name__ if isinstance(types, type) else " or ".join(t.__name__ for t in types)
        raise DataError(f"{where}: field {key!r} must be {names}, got {json.dumps(v)[:60]}")
    return v


def _most_common(answers: list[str]) -> str:
    real = [a for a in answers if a]
    return Counter(real).most_common(1)[0][0] if real else ""


class _ImageFinder:
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

    def file(self, file_name: str) -> Path | None:
        """`<split>/<file_name>` (or `<split>2014/`, `images/<split>/`, `images/`)."""
        for d in self.dirs:
            if ("/" in file_name and (d / file_name).is_file()) or file_name in self._listing(d):
                return d / file_name
        return None if self.check else self.default_dir / file_name


# typed views of the official files: msgspec skips every other field without building it
class _Question(msgspec.Struct, gc=False):
    question_id: int | str
    image_id: int | str
    question: str


class _Questions(msgspec.Struct):
    questions: list[_Question]


class _Answer(msgspec.Struct, gc=False):
    answer: str


class _Annotation(msgspec.Struct, gc=False):
    question_id: int | str
    answers: list[_Answer]
    answer_type: Any = ""
    question_type: Any = ""
    multiple_choice_answer: Any = None


class _Annotations(msgspec.Struct):
    annotations: list[msgspec.Raw]  # each decoded on its own: the whole file never exists as objects


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


_QUESTIONS = msgspec.json.Decoder(_Questions)
_ANNOTATIONS = msgspec.json.Decoder(_Annotations)
_ANNOTATION = msgspec.json.Decoder(_Annotation)
_COCO = msgspec.json.Decoder(_Coco)


def _read_questions(path: Path) -> list[_Question]:
    fast = _fast(_read_bytes(path), _QUESTIONS)
    if fast is not None:
        return fast.questions
    out = []  # the slow way, only to name the first problem (or to accept what msgspec would not)
    for i, q in enumerate(_get_list(read_json(path), "questions", path, "VQA v2 questions")):
        where = f"{path}: questions[{i}]"
        out.append(_Question(_req(q, "question_id", (int, str), where), _req(q, "image_id", (int, str), where),
                             _req(q, "question", str, where)))
    return out


def _read_annotations(path: Path) -> Iterator[_Annotation]:
    fast = _fast(_read_bytes(path), _ANNOTATIONS)
    items: list = fast.annotations if fast is not None else _get_list(read_json(path), "annotations", path,
                                                                     "VQA v2 annotations")
    for i, raw in enumerate(items):
        a = _fast(raw, _ANNOTATION) if isinstance(raw, msgspec.Raw) else None
        if a is None:
            obj = json.loads(bytes(raw)) if isinstance(raw, msgspec.Raw) else raw
            where = f"{path}: annotations[{i}]"
            qid = _req(obj, "question_id", (int, str), where)
            answers = [_Answer(_req(ans, "answer", str, f"{where}.answers[{j}]"))
                       for j, ans in enumerate(_req(obj, "answers", list, where))]
            a = _Annotation(qid, answers, obj.get("answer_type", ""), obj.get("question_type", ""),
                            obj.get("multiple_choice_answer"))
        items[i] = None  # each Raw (or dict) is dropped once read
        yield a


def _load_vqa(qpath: Path, finder: _ImageFinder, sd: SplitData, out: VQABuilder, require_answers: bool) -> None:
    m = VQA_QUESTIONS.match(qpath.name)
    assert m is not None
    aname = f"{m['v2'] or ''}mscoco_{m['split']}_annotations.json"
    root = sd.data_dir
    apath = next((p for p in (qpath.parent / aname, root / aname, root / "annotations" / aname) if p.is_file()), None)
    questions = _read_questions(qpath)
    sid = out.strings.id
    empty = sid("")
    # the annotations, interned as they are read: question id -> position p; the answers of p are
    # ans[start[p]:start[p + 1]] (string ids); never a Python object per answer
    pos: dict[Any, int] = {}
    start, ans, atype, qtype, mcs = array("q", [0]), array("i"), array("i"), array("i"), array("i")
    if apath is None:
        if require_answers:
            raise DataError(f"{qpath}: no annotations file {aname} beside it (or in {root} or {root / 'annotations'})")
    else:
        sd.files.append(apath)
        for a in _read_annotations(apath):
            pos[a.question_id] = len(atype)
            # all ten, empty strings included: the official evaluation scores against every annotator's
            # answer (and normalizes only when they disagree), so dropping one would change the score
            ans.extend([sid(x.answer.strip()) for x in a.answers])
            start.append(len(ans))
            atype.append(sid(str(a.answer_type)))
            qtype.append(sid(str(a.question_type)))
            mc = a.multiple_choice_answer
            mcs.append(sid(mc.strip()) if isinstance(mc, str) and mc.strip() else -1)
    images: dict[Any, int | None] = {}  # image id -> index in sd.image_files (None: missing)
    for i, q in enumerate(questions):
        questions[i] = None  # type: ignore[call-overload]  # released as we go
        text = q.question.strip()
        p = pos.pop(q.question_id, None)
        if not text:
            sd.skipped["empty question"] += 1
            continue
        if p is None and require_answers:
            sd.skipped["question without annotation"] += 1
            continue
        answers = ans[start[p] : start[p + 1]].tolist() if p is not None else []
        real = [a for a in answers if a != empty]
        if not real and require_answers:
            sd.skipped["question with only empty answers"] += 1
            continue
        if q.image_id not in images:
            path = finder.vqa(q.image_id)
            images[q.image_id] = None if path is None else sd.image_files.id(path)
        image = images[q.image_id]
        if image is None:
            sd.skipped["question with a missing image"] += 1
            continue
        if p is None:
            out.add_ids(image, sid(text), [], q.question_id, q.image_id, empty, empty, empty)
            continue
        mc = mcs[p] if mcs[p] >= 0 else (Counter(real).most_common(1)[0][0] if real else empty)
        out.add_ids(image, sid(text), answers, q.question_id, q.image_id, atype[p], qtype[p], mc)
    if pos:
        sd.skipped["annotation without a question"] += len(pos)


def _read_coco(path: Path) -> _Coco:
    fast = _fast(_read_bytes(path), _COCO)
    if fast is not None:
        return fast
    data = read_json(path)
    images = _get_list(data, "images", path, "COCO captions")
    annotations = _get_list(data, "annotations", path, "COCO captions")
    out = _Coco([], [])
    for i, im in enumerate(images):
        where = f"{path}: images[{i}]"
        out.images.append(_CocoImage(_req(im, "id", (int, str), where), _req(im, "file_name", str, where)))
    for i, a in enumerate(annotations):
        where = f"{path}: annotations[{i}]"
        out.annotations.append(_CocoCaption(_req(a, "image_id", (int, str), where), _req(a, "caption", str, where),
                                            a.get("id")))
    return out


def _load_coco(path: Path, finder: _ImageFinder, sd: SplitData, out: CaptionBuilder) -> None:
    data = _read_coco(path)
    files = {im.id: im.file_name for im in data.images}
    resolved: dict[Any, int | None] = {}
    for a in data.annotations:
        caption = " ".join(a.caption.split())
        if not caption:
            sd.skipped["empty caption"] += 1
            continue
        if a.image_id not in files:
            sd.skipped["caption of an image id not in 'images'"] += 1
            continue
        if a.image_id not in resolved:
            path_ = finder.file(files[a.image_id])
            resolved[a.image_id] = None if path_ is None else sd.image_files.id(path_)
        if resolved[a.image_id] is None:
            sd.skipped["caption with a missing image"] += 1
            continue
        out.add(resolved[a.image_id], caption, a.image_id, a.id)


def _answers(v: Any, where: str) -> list[str]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v:
        raise DataError(f"{where}: field 'answers' must be a non-empty list of strings")
    out = []
    for j, a in enumerate(v):
        a = a.get("answer") if isinstance(a, dict) else a
        if not isinstance(a, str) or not a.strip():
            raise DataError(f"{where}: field 'answers'[{j}] must be a non-empty string")
        out.append(a.strip())
    return out


def _text(obj: dict, key: str, where: str) -> str:
    v = obj[key]
    if not isinstance(v, str) or not v.strip():
        raise DataError(f"{where}: field {key!r} must be a non-empty string, got {json.dumps(v)[:60]}")
    return " ".join(v.split())


def _load_jsonl(path: Path, sd: SplitData, vqa: VQABuilder, caps: CaptionBuilder, check_images: bool) -> None:
    """One JSON object a line: {"image", "question", "answers"} and/or {"image", "caption"}."""
    text = _decode(path, _read_bytes(path))
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}:{e.colno}: malformed JSON: {e.msg}") from None
        if not isinstance(obj, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        if "image" not in obj:
            raise DataError(f"{where}: missing field 'image'")
        image_rel = _text(obj, "image", where)
        has_q, has_c = "question" in obj, "caption" in obj
        if not has_q and not has_c:
            raise DataError(f"{where}: needs a 'question' (with 'answers') or a 'caption'")
        if "answers" in obj and not has_q:
            raise DataError(f"{where}: field 'answers' without a 'question'")
        if has_q and "answers" not in obj:
            raise DataError(f"{where}: field 'question' without 'answers'")
        question = _text(obj, "question", where) if has_q else ""
        answers = _answers(obj["answers"], where) if has_q else []
        caption = _text(obj, "caption", where) if has_c else ""
        image = path.parent / image_rel
        if check_images and not image.is_file():
            sd.skipped["line with a missing image"] += 1
            continue
        image_id = obj.get("image_id", image_rel)
        if has_q:
            mc = obj.get("multiple_choice_answer")
            vqa.add(image, question, answers, obj.get("question_id", f"{path.stem}:{lineno}"), image_id,
                    str(obj.get("answer_type", "")), str(obj.get("question_type", "")),
                    mc.strip() if isinstance(mc, str) and mc.strip() else _most_common(answers))
        if has_c:
            caps.add(image, caption, image_id, obj.get("caption_id", f"{path.stem}:{lineno}"))


__all__ = ["VQARecord", "CaptionRecord", "SplitData", "VQATable", "CaptionTable", "find_splits", "pick_split",
           "load_split", "corpus_texts", "corpus_batches", "read_json", "skipped_summary"]
