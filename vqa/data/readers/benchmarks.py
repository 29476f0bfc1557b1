"""The other VQA benchmarks' official question files: TextVQA, VizWiz and GQA (balanced questions).

TextVQA   `TextVQA_0.5.1_<split>.json`: {"dataset_name": "textvqa", "data": [{"question_id", "image_id",
          "question", "answers": [10 strings], ...}]}; images `train_images/<image_id>.jpg` (val's too) and
          `test_images/`; the test file has no answers.
VizWiz    `Annotations/<split>.json` (or `annotations/`): [{"image": "VizWiz_val_00000000.jpg", "question",
          "answers": [{"answer", "answer_confidence"} x 10], "answer_type", "answerable"}]; images
          `<split>/<image>` (or `images/`); one question per image, so the question id is the image's file name
          (as the VizWiz result file keys answers by "image").
GQA       `<split>_balanced_questions.json` (train, val, testdev, ...): {"<question id>": {"imageId", "question",
          "answer", "types": {"structural", "semantic", "detailed"}, ...}}; images `images/<imageId>.jpg`. The
          answer type is the structural type (verify, query, choose, logical, compare: GQA's per-type table),
          the question type the detailed one.

Each is scored by its own evaluator's rules (`vqa.evaluation.answer_rules`, chosen by the format name that
`SplitData.vqa_formats` records): TextVQA's, VizWiz's, and GQA's exact match with its single answer. Empty
questions, questions without answers (kept with `require_answers=False`) and missing images are counted in
`SplitData.skipped`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import msgspec

from ...errors import DataError
from ..records import VQABuilder
from ..split import ImageFinder, SplitData
from .json_fields import decode_fast, get_list, read_bytes, read_json, read_list, required

TEXTVQA = re.compile(r"^TextVQA_[0-9.]+_(?P<split>[A-Za-z0-9]+)\.json$")
VIZWIZ = re.compile(r"^(?P<split>train|val|test)\.json$")  # only in an annotations folder holding VizWiz images
GQA = re.compile(r"^(?P<split>[A-Za-z0-9]+)_balanced_questions\.json$")


def is_vizwiz(path: Path) -> bool:
    """`train.json` is a common name: the file is VizWiz's when its first image is named like theirs."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return path.parent.name in ("Annotations", "annotations") and b'"VizWiz_' in head


class _Question:
    __slots__ = ("question_id", "image_id", "file", "question", "answers", "answer_type", "question_type")

    def __init__(self, question_id, image_id, file, question, answers, answer_type="", question_type=""):
        self.question_id, self.image_id, self.file, self.question = question_id, image_id, file, question
        self.answers, self.answer_type, self.question_type = answers, answer_type, question_type


def _add(questions: Iterable[_Question], folders: list[Path], finder: ImageFinder, split_data: SplitData,
         out: VQABuilder, require_answers: bool) -> None:
    images: dict[str, int | None] = {}
    for q in questions:
        text = " ".join(q.question.split())
        answers = [a.strip() for a in q.answers or []]
        if not text:
            split_data.skipped["empty question"] += 1
            continue
        if not any(answers) and require_answers:
            why = "question without answers" if q.answers is None else "question with only empty answers"
            split_data.skipped[why] += 1
            continue
        if q.file not in images:
            path = finder.named(q.file, folders)
            images[q.file] = None if path is None else split_data.image_files.id(path)
        if images[q.file] is None:
            split_data.skipped["question with a missing image"] += 1
            continue
        real = [a for a in answers if a]
        mc = Counter(real).most_common(1)[0][0] if real else ""
        out.add(images[q.file], text, answers, q.question_id, q.image_id, q.answer_type, q.question_type, mc)


# --- TextVQA ----------------------------------------------------------------------------------------------
class _TextVQAItem(msgspec.Struct, gc=False):
    question_id: int | str
    image_id: str
    question: str
    answers: list[str] | None = None


class _TextVQA(msgspec.Struct):
    data: list[_TextVQAItem]


_TEXTVQA = msgspec.json.Decoder(_TextVQA)


def _textvqa_item(q, where: str) -> _TextVQAItem:
    answers = required(q, "answers", list, where) if isinstance(q, dict) and "answers" in q else None
    bad = next((j for j, a in enumerate(answers or []) if not isinstance(a, str)), None)
    if bad is not None:
        raise DataError(f"{where}: answers[{bad}] must be str, got {answers[bad]!r:.60}")
    return _TextVQAItem(required(q, "question_id", (int, str), where), required(q, "image_id", str, where),
                        required(q, "question", str, where), answers)


def load_textvqa(path: Path, split: str, finder: ImageFinder, split_data: SplitData, out: VQABuilder,
                 require_answers: bool) -> None:
    root = split_data.data_dir
    folders = [root / f"{split}_images", root / "train_images", root / "images"]
    items = read_list(path, _TEXTVQA, "data", "TextVQA", _textvqa_item)
    _add((_Question(q.question_id, q.image_id, f"{q.image_id}.jpg", q.question, q.answers) for q in items),
         folders, finder, split_data, out, require_answers)


# --- VizWiz -----------------------------------------------------------------------------------------------
class _VizWizAnswer(msgspec.Struct, gc=False):
    answer: str


class _VizWizItem(msgspec.Struct, gc=False):
    image: str
    question: str
    answers: list[_VizWizAnswer] | None = None
    answer_type: str = ""


_VIZWIZ = msgspec.json.Decoder(list[_VizWizItem])


def _read_vizwiz(path: Path) -> list[_VizWizItem]:
    fast = decode_fast(read_bytes(path), _VIZWIZ)
    if fast is not None:
        return fast
    data = read_json(path)
    if not isinstance(data, list):
        get_list(data, "annotations", path, "VizWiz: a JSON list of questions")  # raises, naming the format
    out = []
    for i, q in enumerate(data):
        where = f"{path}: [{i}]"
        answers = None
        if isinstance(q, dict) and "answers" in q:
            answers = [_VizWizAnswer(required(a, "answer", str, f"{where}.answers[{j}]"))
                       for j, a in enumerate(required(q, "answers", list, where))]
        out.append(_VizWizItem(required(q, "image", str, where), required(q, "question", str, where), answers,
                               str(q.get("answer_type") or "")))
    return out


def load_vizwiz(path: Path, split: str, finder: ImageFinder, split_data: SplitData, out: VQABuilder,
                require_answers: bool) -> None:
    root = split_data.data_dir
    folders = [root / split, root / "images" / split, root / "Images", root / "images"]
    _add((_Question(q.image, Path(q.image).stem, q.image, q.question,
                    None if q.answers is None else [a.answer for a in q.answers], q.answer_type)
          for q in _read_vizwiz(path)), folders, finder, split_data, out, require_answers)


# --- GQA --------------------------------------------------------------------------------------------------
class _GQATypes(msgspec.Struct, gc=False):
    structural: str = ""
    detailed: str = ""


class _GQAItem(msgspec.Struct, gc=False):
    imageId: str  # noqa: N815 (GQA's field name)
    question: str
    answer: str | None = None
    types: _GQATypes | None = None


_GQA = msgspec.json.Decoder(dict[str, _GQAItem])


def _read_gqa(path: Path) -> dict[str, _GQAItem]:
    fast = decode_fast(read_bytes(path), _GQA)
    if fast is not None:
        return fast
    data = read_json(path)
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected a JSON object of question id -> question (GQA balanced questions format)")
    out = {}
    for qid, q in data.items():
        where = f"{path}: question {qid!r}"
        answer = required(q, "answer", str, where) if isinstance(q, dict) and "answer" in q else None
        types = q.get("types") if isinstance(q, dict) else None
        types = types if isinstance(types, dict) else {}
        out[qid] = _GQAItem(required(q, "imageId", str, where), required(q, "question", str, where), answer,
                            _GQATypes(str(types.get("structural") or ""), str(types.get("detailed") or "")))
    return out


def load_gqa(path: Path, split: str, finder: ImageFinder, split_data: SplitData, out: VQABuilder,
             require_answers: bool) -> None:
    root = split_data.data_dir
    folders = [root / "images", root / split]
    _add((_Question(qid, q.imageId, f"{q.imageId}.jpg", q.question, None if q.answer is None else [q.answer],
                    q.types.structural if q.types else "", q.types.detailed if q.types else "")
          for qid, q in _read_gqa(path).items()), folders, finder, split_data, out, require_answers)
