"""The project's own schema: `<split>.jsonl`, one JSON object a line, {"image", "question", "answers"} and/or
{"image", "caption"}, image paths relative to the file. A malformed line is a DataError naming the line and
field; a line whose image is missing is counted in `SplitData.skipped`."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...errors import DataError
from ..records import CaptionBuilder, VQABuilder
from ..split import SplitData
from .json_fields import decode_text, read_bytes

JSONL = re.compile(r"^(?P<split>.+)\.jsonl$")


def _most_common(answers: list[str]) -> str:
    real = [a for a in answers if a]
    return Counter(real).most_common(1)[0][0] if real else ""


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


def json_objects(text: str, path: str | Path) -> Iterator[tuple[int, str, dict]]:
    """(line number, "file:line", object) for each non-blank line of a JSON Lines text; a line that is not
    JSON, or not a JSON object, is a DataError naming the file, line and column."""
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
        yield lineno, where, obj


def text_field(obj: dict, key: str, where: str) -> str:
    """obj[key] as a non-empty string with its whitespace collapsed, else a DataError naming the field."""
    v = obj.get(key)
    if not isinstance(v, str) or not v.strip():
        raise DataError(f"{where}: field {key!r} must be a non-empty string, got {json.dumps(v)[:60]}")
    return " ".join(v.split())




def load_jsonl(path: Path, split_data: SplitData, vqa: VQABuilder, caps: CaptionBuilder,
               check_images: bool) -> None:
    """One JSON object a line: {"image", "question", "answers"} and/or {"image", "caption"}."""
    text = decode_text(path, read_bytes(path))
    seen: dict = {}  # question id -> its line
    for lineno, where, obj in json_objects(text, path):
        if "image" not in obj:
            raise DataError(f"{where}: missing field 'image'")
        image_rel = text_field(obj, "image", where)
        has_q, has_c = "question" in obj, "caption" in obj
        if not has_q and not has_c:
            raise DataError(f"{where}: needs a 'question' (with 'answers') or a 'caption'")
        if "answers" in obj and not has_q:
            raise DataError(f"{where}: field 'answers' without a 'question'")
        if has_q and "answers" not in obj:
            raise DataError(f"{where}: field 'question' without 'answers'")
        question = text_field(obj, "question", where) if has_q else ""
        answers = _answers(obj["answers"], where) if has_q else []
        caption = text_field(obj, "caption", where) if has_c else ""
        image = path.parent / image_rel
        if check_images and not image.is_file():
            split_data.skipped["line with a missing image"] += 1
            continue
        image_id = obj.get("image_id", image_rel)
        if has_q:
            qid = obj.get("question_id", f"{path.stem}:{lineno}")
            if not isinstance(qid, (int, str)) or isinstance(qid, bool):
                raise DataError(f"{where}: field 'question_id' must be an integer or a string, "
                                f"got {json.dumps(qid)[:60]}")
            if qid in seen:  # evaluation keys its answers by question id: a repeat would lose one silently
                raise DataError(f"{where}: question_id {json.dumps(qid)} is also on line {seen[qid]}; "
                                "question ids must be unique")
            seen[qid] = lineno
            mc = obj.get("multiple_choice_answer")
            vqa.add(image, question, answers, qid, image_id,
                    str(obj.get("answer_type", "")), str(obj.get("question_type", "")),
                    mc.strip() if isinstance(mc, str) and mc.strip() else _most_common(answers))
        if has_c:
            caps.add(image, caption, image_id, obj.get("caption_id", f"{path.stem}:{lineno}"))
