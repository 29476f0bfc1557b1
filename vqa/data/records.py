"""Compact, columnar records: one split of VQA v2 (443,757 questions x 10 answers) in tens of megabytes.

Why columns: one Python object per question and per answer is slow to build and holds gigabytes at VQA v2 size.
Here every string (question, answer, answer / question type) is stored once in a pool and referenced by an
int32 id; the ten answers of a question are a slice of one int32 array (CSR layout: `ans_start[i]` to
`ans_start[i + 1]`), empty answers included, since the official evaluation scores against all ten. Ids
(question_id, image_id, caption_id) are int64 arrays when every id is an integer, else a list.

Indexing a table still gives the familiar record objects (`table[i]` -> VQARecord), built on demand, so
code that reads a few records (evaluation metadata, tests, the items of a batch) sees dataclasses, and code
that reads all of them (grouping by image, the tokenizer's corpus, `vqa data info`) uses the columns.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


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


class Strings:
    """An interning pool: each distinct string stored once, referenced by an int id."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self._ids: dict[str, int] = {}

    def id(self, s: str) -> int:
        i = self._ids.get(s)
        if i is None:
            i = self._ids[s] = len(self.items)
            self.items.append(s)
        return i

    def __getitem__(self, i: int) -> str:
        return self.items[i]

    def __len__(self) -> int:
        return len(self.items)


class Ids:
    """A column of ids: int64 while every value is an int, a list once one is not (JSONL's 'train:3')."""

    def __init__(self) -> None:
        self._ints: array | None = array("q")
        self._objs: list | None = None

    def append(self, v: Any) -> None:
        if self._ints is not None:
            if type(v) is int and -(2**63) <= v < 2**63:
                self._ints.append(v)
                return
            self._objs = self._ints.tolist()
            self._ints = None
        self._objs.append(v)

    def freeze(self) -> np.ndarray | list:
        return np.frombuffer(self._ints, dtype=np.int64).copy() if self._ints is not None else self._objs


def _get(col: np.ndarray | list, i: int) -> Any:
    v = col[i]
    return int(v) if isinstance(v, np.integer) else v


def _take(col: np.ndarray | list, idx: np.ndarray) -> np.ndarray | list:
    return col[idx] if isinstance(col, np.ndarray) else [col[int(i)] for i in idx]


class Images(Strings):
    """The distinct image files of a split (shared by its VQA and caption tables), as strings."""

    def id(self, path: Path | str) -> int:  # type: ignore[override]
        return super().id(str(path))

    @property
    def paths(self) -> list[str]:
        return self.items


class _Table(Sequence):
    """`table[i]` builds row i's record (`_row`), a slice a list of them; iterating gives every record."""

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._row(i)


class VQATable(_Table):
    """The VQA rows of a split, in columns. `table[i]` is a VQARecord; iterate for all of them."""

    def __init__(self, images: Images, strings: Strings, image: np.ndarray, question: np.ndarray,
                 ans_start: np.ndarray, answers: np.ndarray, question_id, image_id,
                 answer_type: np.ndarray, question_type: np.ndarray, mc: np.ndarray):
        self.images, self.strings = images, strings
        self.image, self.question = image, question  # [N] int32: image index, string id
        self.ans_start, self.answers = ans_start, answers  # [N+1] int64, [total] int32 string ids
        self.question_id, self.image_id = question_id, image_id
        self.answer_type, self.question_type, self.mc = answer_type, question_type, mc

    @classmethod
    def empty(cls, images: Images | None = None, strings: Strings | None = None) -> VQATable:
        return VQABuilder(images if images is not None else Images(),
                          strings if strings is not None else Strings()).freeze()

    @classmethod
    def from_records(cls, records: Sequence[VQARecord], images: Images | None = None) -> VQATable:
        b = VQABuilder(images if images is not None else Images(), Strings())
        for r in records:
            b.add(r.image, r.question, r.answers, r.question_id, r.image_id, r.answer_type, r.question_type,
                  r.multiple_choice_answer)
        return b.freeze()

    def __len__(self) -> int:
        return len(self.question)

    def answers_of(self, i: int) -> list[str]:
        s = self.strings.items
        return [s[a] for a in self.answers[self.ans_start[i] : self.ans_start[i + 1]].tolist()]

    def _row(self, i: int) -> VQARecord:
        s = self.strings.items
        return VQARecord(
            image=Path(self.images.paths[self.image[i]]), question=s[self.question[i]], answers=self.answers_of(i),
            question_id=_get(self.question_id, i), image_id=_get(self.image_id, i),
            answer_type=s[self.answer_type[i]], question_type=s[self.question_type[i]],
            multiple_choice_answer=s[self.mc[i]],
        )

    def select(self, keep: np.ndarray) -> VQATable:
        """The rows at the indices `keep` (in that order)."""
        keep = np.asarray(keep, dtype=np.int64)
        lens = (self.ans_start[1:] - self.ans_start[:-1])[keep]
        start = np.zeros(len(keep) + 1, dtype=np.int64)
        np.cumsum(lens, out=start[1:])
        # the answers of each kept row, gathered in one pass: row k's slice begins at ans_start[keep[k]]
        src = np.repeat(self.ans_start[:-1][keep] - start[:-1], lens) + np.arange(start[-1], dtype=np.int64)
        return VQATable(self.images, self.strings, self.image[keep], self.question[keep], start,
                        self.answers[src], _take(self.question_id, keep), _take(self.image_id, keep),
                        self.answer_type[keep], self.question_type[keep], self.mc[keep])


class CaptionTable(_Table):
    """The caption rows of a split, in columns. `table[i]` is a CaptionRecord."""

    def __init__(self, images: Images, image: np.ndarray, caption: list[str], image_id, caption_id):
        self.images = images
        self.image, self.caption = image, caption  # [N] int32 image index; the texts (mostly distinct)
        self.image_id, self.caption_id = image_id, caption_id

    @classmethod
    def empty(cls, images: Images | None = None) -> CaptionTable:
        return CaptionBuilder(images if images is not None else Images()).freeze()

    @classmethod
    def from_records(cls, records: Sequence[CaptionRecord], images: Images | None = None) -> CaptionTable:
        b = CaptionBuilder(images if images is not None else Images())
        for c in records:
            b.add(c.image, c.caption, c.image_id, c.caption_id)
        return b.freeze()

    def __len__(self) -> int:
        return len(self.caption)

    def _row(self, i: int) -> CaptionRecord:
        return CaptionRecord(Path(self.images.paths[self.image[i]]), self.caption[i], _get(self.image_id, i),
                             _get(self.caption_id, i))


class VQABuilder:
    """Rows appended one at a time into compact arrays; `freeze()` makes the table."""

    def __init__(self, images: Images, strings: Strings):
        self.images, self.strings = images, strings
        self.image, self.question = array("i"), array("i")
        self.ans_start, self.answers = array("q", [0]), array("i")
        self.question_id, self.image_id = Ids(), Ids()
        self.answer_type, self.question_type, self.mc = array("i"), array("i"), array("i")

    def add(self, image: Path | str | int, question: str, answers: Sequence[str], question_id, image_id,
            answer_type: str = "", question_type: str = "", mc: str = "") -> None:
        """`image`: a path, or an index into `images` already."""
        sid = self.strings.id
        self.image.append(image if isinstance(image, int) else self.images.id(image))
        self.question.append(sid(question))
        self.answers.extend([sid(a) for a in answers])
        self.ans_start.append(len(self.answers))
        self.question_id.append(question_id)
        self.image_id.append(image_id)
        self.answer_type.append(sid(answer_type))
        self.question_type.append(sid(question_type))
        self.mc.append(sid(mc))

    def add_ids(self, image: int, question: int, answers: list[int], question_id, image_id, answer_type: int,
                question_type: int, mc: int) -> None:
        """`add` with the strings already interned in `strings` and the image an index into `images`."""
        self.image.append(image)
        self.question.append(question)
        self.answers.extend(answers)
        self.ans_start.append(len(self.answers))
        self.question_id.append(question_id)
        self.image_id.append(image_id)
        self.answer_type.append(answer_type)
        self.question_type.append(question_type)
        self.mc.append(mc)

    def freeze(self) -> VQATable:
        def np32(a: array) -> np.ndarray:
            return np.frombuffer(a, dtype=np.int32).copy() if len(a) else np.zeros(0, dtype=np.int32)

        return VQATable(self.images, self.strings, np32(self.image), np32(self.question),
                        np.frombuffer(self.ans_start, dtype=np.int64).copy(), np32(self.answers),
                        self.question_id.freeze(), self.image_id.freeze(), np32(self.answer_type),
                        np32(self.question_type), np32(self.mc))


class CaptionBuilder:
    def __init__(self, images: Images):
        self.images = images
        self.image, self.caption = array("i"), []
        self.image_id, self.caption_id = Ids(), Ids()

    def add(self, image: Path | str | int, caption: str, image_id, caption_id) -> None:
        self.image.append(image if isinstance(image, int) else self.images.id(image))
        self.caption.append(caption)
        self.image_id.append(image_id)
        self.caption_id.append(caption_id)

    def freeze(self) -> CaptionTable:
        image = np.frombuffer(self.image, dtype=np.int32).copy() if len(self.image) else np.zeros(0, np.int32)
        return CaptionTable(self.images, image, self.caption, self.image_id.freeze(), self.caption_id.freeze())


__all__ = ["VQARecord", "CaptionRecord", "VQATable", "CaptionTable", "VQABuilder", "CaptionBuilder", "Images",
           "Strings", "Ids"]
