"""VQA v2 and OK-VQA: `[v2_]OpenEnded_mscoco_<split>_questions.json` with `[v2_]mscoco_<split>_annotations.json`.

Parsed with msgspec into typed structs (a VQA v2 annotations file of 443,757 questions in a few seconds,
without a Python dict per answer). A record keeps all its annotators' answers, empty ones included, as the
official evaluation scores against them; training samples among the non-empty ones. Questions without an
annotation, with only empty answers or a missing image, and empty questions, are counted in `SplitData.skipped`.
"""

from __future__ import annotations

import json
import re
from array import array
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from ...errors import DataError
from ..records import VQABuilder
from ..split import ImageFinder, SplitData
from .json_fields import decode_fast, get_list, read_bytes, read_json, required

VQA_QUESTIONS = re.compile(r"^(?P<v2>v2_)?OpenEnded_mscoco_(?P<split>.+)_questions\.json$")


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


_QUESTIONS = msgspec.json.Decoder(_Questions)
_ANNOTATIONS = msgspec.json.Decoder(_Annotations)
_ANNOTATION = msgspec.json.Decoder(_Annotation)


def _read_questions(path: Path) -> list[_Question]:
    fast = decode_fast(read_bytes(path), _QUESTIONS)
    if fast is not None:
        return fast.questions
    out = []  # the slow way, only to name the first problem (or to accept what msgspec would not)
    for i, q in enumerate(get_list(read_json(path), "questions", path, "VQA v2 questions")):
        where = f"{path}: questions[{i}]"
        out.append(_Question(required(q, "question_id", (int, str), where),
                             required(q, "image_id", (int, str), where), required(q, "question", str, where)))
    return out


def _read_annotations(path: Path) -> Iterator[_Annotation]:
    fast = decode_fast(read_bytes(path), _ANNOTATIONS)
    items: list = fast.annotations if fast is not None else get_list(read_json(path), "annotations", path,
                                                                    "VQA v2 annotations")
    for i, raw in enumerate(items):
        a = decode_fast(raw, _ANNOTATION) if isinstance(raw, msgspec.Raw) else None
        if a is None:
            obj = json.loads(bytes(raw)) if isinstance(raw, msgspec.Raw) else raw
            where = f"{path}: annotations[{i}]"
            qid = required(obj, "question_id", (int, str), where)
            answers = [_Answer(required(ans, "answer", str, f"{where}.answers[{j}]"))
                       for j, ans in enumerate(required(obj, "answers", list, where))]
            a = _Annotation(qid, answers, obj.get("answer_type", ""), obj.get("question_type", ""),
                            obj.get("multiple_choice_answer"))
        items[i] = None  # each Raw (or dict) is dropped once read
        yield a


def load_vqa(qpath: Path, finder: ImageFinder, split_data: SplitData, out: VQABuilder,
             require_answers: bool) -> None:
    m = VQA_QUESTIONS.match(qpath.name)
    assert m is not None
    aname = f"{m['v2'] or ''}mscoco_{m['split']}_annotations.json"
    root = split_data.data_dir
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
        split_data.files.append(apath)
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
    images: dict[Any, int | None] = {}  # image id -> index in split_data.image_files (None: missing)
    for i, q in enumerate(questions):
        questions[i] = None  # type: ignore[call-overload]  # released as we go
        text = q.question.strip()
        p = pos.pop(q.question_id, None)
        if not text:
            split_data.skipped["empty question"] += 1
            continue
        if p is None and require_answers:
            split_data.skipped["question without annotation"] += 1
            continue
        answers = ans[start[p] : start[p + 1]].tolist() if p is not None else []
        real = [a for a in answers if a != empty]
        if not real and require_answers:
            split_data.skipped["question with only empty answers"] += 1
            continue
        if q.image_id not in images:
            path = finder.vqa(q.image_id)
            images[q.image_id] = None if path is None else split_data.image_files.id(path)
        image = images[q.image_id]
        if image is None:
            split_data.skipped["question with a missing image"] += 1
            continue
        if p is None:
            out.add_ids(image, sid(text), [], q.question_id, q.image_id, empty, empty, empty)
            continue
        mc = mcs[p] if mcs[p] >= 0 else (Counter(real).most_common(1)[0][0] if real else empty)
        out.add_ids(image, sid(text), answers, q.question_id, q.image_id, atype[p], qtype[p], mc)
    if pos:
        split_data.skipped["annotation without a question"] += len(pos)
