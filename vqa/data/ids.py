"""The identity of a split's items, checked when the split is opened for evaluation.

Evaluation scores an answer by its question's `question_id` and a caption by its image's `image_id`
(`vqa.evaluation.evaluate`), so two items with one id would silently overwrite each other. A sample's ids are
the ones its data gives, else derived from its key (`KEY:0` for its first question; the key itself for its
image), and a key includes the shard where the data has none (`vqa.data.readers.shards`: a parquet row without a
`key` column is `<shard name>/<row>`). `check_ids` reads the ids of the samples an evaluation will see (a
parquet shard without its image column) and stops at the first id that repeats, naming both samples: before
any training step or decoding, never after. A folder split is checked the same way from its tables: an
image_id on two image files, or a question_id on two questions."""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import DataError
from .readers.shards import ShardSplit


def check_ids(split, tasks: Iterable[str] = ("vqa", "caption"), max_images: int | None = None) -> None:
    """DataError naming the first repeated question_id (task vqa) or image_id (task caption) among the first
    `max_images` samples of `split` (all of them when None), with the samples that share it. A folder split
    is checked whole (its tables are in memory)."""
    tasks = tuple(tasks)
    if split is None:
        return
    if not isinstance(split, ShardSplit):
        _check_tables(split, tasks)
        return
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


def _check_tables(split_data, tasks: tuple[str, ...]) -> None:
    """A folder split (`SplitData`): an image_id on two image files, a question_id on two questions."""
    paths = split_data.image_files.paths
    if "caption" in tasks:
        images: dict = {}
        t = split_data.captions
        for ident, image in zip(_ids(t.image_id), t.image.tolist(), strict=True):
            if images.setdefault(ident, image) != image:
                raise DataError(f"{split_data.split}: image_id {ident!r} is on two image files, "
                                f"{paths[images[ident]]} and {paths[image]}; ids must be unique in a split "
                                "(evaluation scores by them)")
    if "vqa" in tasks:
        questions: dict = {}
        t = split_data.vqa
        for ident, image in zip(_ids(t.question_id), t.image.tolist(), strict=True):
            if ident in questions:
                raise DataError(f"{split_data.split}: question_id {ident!r} is on two questions (about "
                                f"{paths[questions[ident]]} and {paths[image]}); ids must be unique in a split "
                                "(evaluation scores by them)")
            questions[ident] = image


def _ids(ids) -> list:
    return ids.tolist() if hasattr(ids, "tolist") else list(ids)


def _first(seen: dict, what: str, ident, where: str, split: ShardSplit) -> None:
    if ident in seen:
        raise DataError(f"{split.where}: {what} {ident!r} of {where} is also that of {seen[ident]}; ids must be "
                        "unique in a split (evaluation scores by them): give each sample a key (or id) of its own")
    seen[ident] = where


__all__ = ["check_ids"]
