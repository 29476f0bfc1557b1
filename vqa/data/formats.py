"""Readers for the data set formats: VQA v2 / OK-VQA, COCO captions and the project's JSONL schema.

A data set is a folder; its splits are found from the file names (see `find_splits`), and one split may mix
formats (the Shapes set has VQA v2 questions and COCO captions for the same images). Every reader turns its
files into plain records, so the torch datasets never see a format. Bad files raise DataError naming the file
and the line (or array position) and field; recoverable problems (a missing image, a question without an
annotation, an empty question or caption in an official file) are counted in `SplitData.skipped` and
reported, never silently dropped. A VQA v2 record keeps all its annotators' answers, empty ones included, as
the official evaluation scores against them; training samples among the non-empty ones.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import DataError

VQA_QUESTIONS = re.compile(r"^(?P<v2>v2_)?OpenEnded_mscoco_(?P<split>.+)_questions\.json$")
COCO_CAPTIONS = re.compile(r"^captions_(?P<split>.+)\.json$")
JSONL = re.compile(r"^(?P<split>.+)\.jsonl$")
IMAGE_EXTS = (".jpg", ".png", ".jpeg", ".JPG", ".PNG", ".JPEG")


@dataclass
class VQARecord:
    image: Path
    question: str
    answers: list[str]
    question_id: int | str
    image_id: int | str
    answer_type: str = ""
    question_type: str = ""
    multiple_choice_answer: str = ""


@dataclass
class CaptionRecord:
    image: Path
    caption: str
    image_id: int | str
    caption_id: int | str | None = None


@dataclass
class SplitData:
    """The records of one split, and what was skipped while reading it (reason -> count)."""

    split: str
    data_dir: Path
    vqa: list[VQARecord] = field(default_factory=list)
    captions: list[CaptionRecord] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)
    files: list[Path] = field(default_factory=list)

    def images(self) -> set[Path]:
        return {r.image for r in self.vqa} | {r.image for r in self.captions}

    def report(self) -> str:
        qi = len({r.image for r in self.vqa})
        ci = len({r.image for r in self.captions})
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
    for kind, s, path in _data_files(data_dir):
        if s != split:
            continue
        sd.files.append(path)
        if kind == "vqa":
            _load_vqa(path, finder, sd, require_answers)
        elif kind == "coco":
            _load_coco(path, finder, sd)
        else:
            _load_jsonl(path, sd, check_images)
    if not sd.vqa and not sd.captions:
        raise DataError(f"{data_dir}: split {split!r} has no usable records ({sd.report()})")
    if sd.skipped and not quiet:
        print(f"warning: {sd.report()}", file=sys.stderr)
    return sd


def corpus_texts(split_data: SplitData | Iterable[SplitData]) -> Iterator[str]:
    """The text a tokenizer should be trained on: questions, their distinct answers, captions."""
    for sd in [split_data] if isinstance(split_data, SplitData) else split_data:
        for r in sd.vqa:
            yield r.question
            yield from (a for a in dict.fromkeys(r.answers) if a)
        for c in sd.captions:
            yield c.caption


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


def read_json(path: Path) -> Any:
    """Parsed JSON; malformed JSON or non-UTF-8 bytes -> DataError with the file, line and column."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        return json.loads(_decode(path, raw))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}:{e.colno}: malformed JSON: {e.msg}") from None


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


def _load_vqa(qpath: Path, finder: _ImageFinder, sd: SplitData, require_answers: bool) -> None:
    m = VQA_QUESTIONS.match(qpath.name)
    assert m is not None
    aname = f"{m['v2'] or ''}mscoco_{m['split']}_annotations.json"
    root = sd.data_dir
    apath = next((p for p in (qpath.parent / aname, root / aname, root / "annotations" / aname) if p.is_file()), None)
    questions = _get_list(read_json(qpath), "questions", qpath, "VQA v2 questions")
    anns: dict[Any, dict] = {}
    if apath is None:
        if require_answers:
            raise DataError(f"{qpath}: no annotations file {aname} beside it (or in {root} or {root / 'annotations'})")
    else:
        sd.files.append(apath)
        for i, a in enumerate(_get_list(read_json(apath), "annotations", apath, "VQA v2 annotations")):
            where = f"{apath}: annotations[{i}]"
            qid = _req(a, "question_id", (int, str), where)
            for j, ans in enumerate(_req(a, "answers", list, where)):
                _req(ans, "answer", str, f"{where}.answers[{j}]")
            anns[qid] = a
    for i, q in enumerate(questions):
        where = f"{qpath}: questions[{i}]"
        qid = _req(q, "question_id", (int, str), where)
        image_id = _req(q, "image_id", (int, str), where)
        text = _req(q, "question", str, where).strip()
        ann = anns.pop(qid, None)
        if not text:
            sd.skipped["empty question"] += 1
            continue
        if ann is None and require_answers:
            sd.skipped["question without annotation"] += 1
            continue
        # all ten, empty strings included: the official evaluation scores against every annotator's answer
        # (and normalizes only when they disagree), so dropping one would change the score
        answers = [a["answer"].strip() for a in (ann or {}).get("answers", [])]
        if not any(answers) and require_answers:
            sd.skipped["question with only empty answers"] += 1
            continue
        image = finder.vqa(image_id)
        if image is None:
            sd.skipped["question with a missing image"] += 1
            continue
        ann = ann or {}
        mc = ann.get("multiple_choice_answer")
        sd.vqa.append(
            VQARecord(
                image=image, question=text, answers=answers, question_id=qid, image_id=image_id,
                answer_type=str(ann.get("answer_type", "")), question_type=str(ann.get("question_type", "")),
                multiple_choice_answer=mc.strip() if isinstance(mc, str) and mc.strip() else _most_common(answers),
            )
        )
    if anns:
        sd.skipped["annotation without a question"] += len(anns)


def _load_coco(path: Path, finder: _ImageFinder, sd: SplitData) -> None:
    data = read_json(path)
    images = _get_list(data, "images", path, "COCO captions")
    annotations = _get_list(data, "annotations", path, "COCO captions")
    files: dict[Any, str] = {}
    for i, im in enumerate(images):
        where = f"{path}: images[{i}]"
        files[_req(im, "id", (int, str), where)] = _req(im, "file_name", str, where)
    resolved: dict[Any, Path | None] = {}
    for i, a in enumerate(annotations):
        where = f"{path}: annotations[{i}]"
        image_id = _req(a, "image_id", (int, str), where)
        caption = " ".join(_req(a, "caption", str, where).split())
        if not caption:
            sd.skipped["empty caption"] += 1
            continue
        if image_id not in files:
            sd.skipped["caption of an image id not in 'images'"] += 1
            continue
        if image_id not in resolved:
            resolved[image_id] = finder.file(files[image_id])
        if resolved[image_id] is None:
            sd.skipped["caption with a missing image"] += 1
            continue
        sd.captions.append(CaptionRecord(resolved[image_id], caption, image_id, a.get("id")))


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


def _load_jsonl(path: Path, sd: SplitData, check_images: bool) -> None:
    """One JSON object a line: {"image", "question", "answers"} and/or {"image", "caption"}."""
    text = _decode(path, path.read_bytes())
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
            sd.vqa.append(
                VQARecord(
                    image=image, question=question, answers=answers,
                    question_id=obj.get("question_id", f"{path.stem}:{lineno}"), image_id=image_id,
                    answer_type=str(obj.get("answer_type", "")), question_type=str(obj.get("question_type", "")),
                    multiple_choice_answer=mc.strip() if isinstance(mc, str) and mc.strip() else _most_common(answers),
                )
            )
        if has_c:
            sd.captions.append(CaptionRecord(image, caption, image_id, obj.get("caption_id", f"{path.stem}:{lineno}")))
