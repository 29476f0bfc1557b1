"""The identity of a shard split's items, checked when the split is opened for evaluation.

Evaluation scores an answer by its question's `question_id` and a caption by its image's `image_id`
(`vqa.evaluation.evaluate`), so two items with one id would silently overwrite each other. A sample's ids are
the ones its data gives, else derived from its key (`KEY:0` for its first question; the key itself for its
image), and a key includes the shard where the data has none (`vqa.data.shards`: a parquet row without a
`key` column is `<shard name>/<row>`). `check_ids` reads the ids of the samples an evaluation will see (a
parquet shard without its image column) and stops at the first id that repeats, naming both samples: before
any training step or decoding, never after."""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import DataError
from .shards import ShardSplit


def check_ids(split, tasks: Iterable[str] = ("vqa", "caption"), max_images: int | None = None) -> None:
    """DataError naming the first repeated question_id (task vqa) or image_id (task caption) among the first
    `max_images` samples of `split` (all of them when None), with the samples that share it. A folder split
    checks its ids as it loads (`vqa.data.jsonl`): nothing to do here."""
    if not isinstance(split, ShardSplit):
        return
    tasks = tuple(tasks)
    questions: dict = {}  # question_id -> the sample it is on
    images: dict = {}  # image_id -> the sample it is of
    n = 0
    for j in range(len(split.shards)):
        for s in split.samples(j, images=False):
            if max_images is not None and n >= max_images:
                return
            n += 1
            if s.bad:
                continue
            qs, caps = s.records()
            if "vqa" in tasks:
                for q in qs:
                    _first(questions, "question_id", q.question_id, s.where, split)
            if "caption" in tasks and caps:
                _first(images, "image_id", caps[0].image_id, s.where, split)


def _first(seen: dict, what: str, ident, where: str, split: ShardSplit) -> None:
    if ident in seen:
        raise DataError(f"{split.where}: {what} {ident!r} of {where} is also that of {seen[ident]}; ids must be "
                        "unique in a split (evaluation scores by them): give each sample a key (or id) of its own")
    seen[ident] = where


__all__ = ["check_ids"]
