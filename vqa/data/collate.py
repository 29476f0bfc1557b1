"""Batches: images once per item; in training their text rows packed across images (`vqa.data.packing`), in
evaluation grouped by task.

Evaluation's `TaskGroup` holds one task's rows right-padded to the group's own longest row, with `image_index`
mapping each row to its image (the prompts are what evaluation decodes from).

In training, `pad_multiple` > 1 pads the packed rows' lengths and counts up to a multiple of it, so
`torch.compile` sees a handful of shapes in an epoch instead of a new one every batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields

import torch

from ..model.packed import PackedRows
from .packing import pack


@dataclass
class TaskGroup:
    """Evaluation's rows of one task in a batch, right-padded to the group's longest row: the prompts to decode
    from and what to score the answers against. Tensors are [B, T] / [B]."""

    task: str
    input_ids: torch.Tensor  # [B, T] long: prompt + target, right-padded
    image_index: torch.Tensor  # [B] long: row -> image of the batch
    prompt_len: torch.Tensor  # [B] long
    meta: list[dict] = field(default_factory=list)  # per row: ids and references for evaluation

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])

    def pin_memory(self) -> TaskGroup:
        return TaskGroup(**{f.name: (v.pin_memory() if torch.is_tensor(v) else v)
                            for f in fields(self) for v in [getattr(self, f.name)]})

    def prompts(self) -> list[list[int]]:
        """The prompt token ids of each row."""
        return [self.input_ids[i, : int(self.prompt_len[i])].tolist() for i in range(self.rows)]


@dataclass
class ImageTextBatch:
    images: torch.Tensor  # [M, 3, S, S] uint8: normalized on the device (`vqa.data.transforms.ImageNormalizer`)
    groups: list[TaskGroup]  # evaluation's rows; empty in training
    jitter: torch.Tensor | None = None  # [M, 2] float: training's brightness and contrast factors per image
    packed: PackedRows | None = None  # training's rows (`collate(task_weights=...)`): every row of the batch

    @property
    def num_images(self) -> int:
        return int(self.images.shape[0])

    def pin_memory(self) -> ImageTextBatch:  # DataLoader(pin_memory=True) calls this
        return ImageTextBatch(self.images.pin_memory(), [g.pin_memory() for g in self.groups],
                     None if self.jitter is None else self.jitter.pin_memory(),
                     None if self.packed is None else self.packed.pin_memory())


def _group(task: str, rows: list[dict], image_index: list[int], pad_id: int) -> TaskGroup:
    t = max(len(r["input_ids"]) for r in rows)
    # padded in Python, then one tensor: a tensor per row costs more than the padding at ~200 rows a batch
    ids = [[*r["input_ids"], *[pad_id] * (t - len(r["input_ids"]))] for r in rows]
    return TaskGroup(task=task, input_ids=torch.tensor(ids, dtype=torch.long).view(len(rows), t),
                     image_index=torch.tensor(image_index, dtype=torch.long),
                     prompt_len=torch.tensor([r["prompt_len"] for r in rows], dtype=torch.long),
                     meta=[r["meta"] for r in rows])


def collate(items: list[dict], pad_id: int, pad_multiple: int = 1,
            task_weights: Mapping[str, float] | None = None) -> ImageTextBatch:  # pad_multiple: training's rows only
    """Items (dict(image=uint8 [3,S,S], rows=[dict(input_ids, loss_mask, task, meta, prompt_len)], and in
    training jitter=[2])) -> an ImageTextBatch: the images stacked once; with `task_weights` (training) the rows packed
    across images, each target weighted by its task's weight (`vqa.data.packing.pack`), else (evaluation) the
    rows grouped by task in order of first appearance."""
    images = torch.stack([item["image"] for item in items]) if items else torch.empty(0)
    jitter = torch.stack([item["jitter"] for item in items]) if items and "jitter" in items[0] else None
    if task_weights is not None:
        return ImageTextBatch(images=images, groups=[], jitter=jitter,
                     packed=pack(items, pad_id, dict(task_weights), pad_multiple))
    by_task: dict[str, tuple[list[dict], list[int]]] = {}
    for k, item in enumerate(items):
        for row in item["rows"]:
            rows, index = by_task.setdefault(row["task"], ([], []))
            rows.append(row)
            index.append(k)
    groups = [_group(task, rows, index, pad_id) for task, (rows, index) in by_task.items()]
    return ImageTextBatch(images=images, groups=groups, jitter=jitter)


def make_collate(pad_id: int, pad_multiple: int = 1,
                 task_weights: Mapping[str, float] | None = None) -> Callable[[list[dict]], ImageTextBatch]:
    """A picklable collate function for DataLoader workers."""
    return functools.partial(collate, pad_id=pad_id, pad_multiple=pad_multiple,
                             task_weights=None if task_weights is None else dict(task_weights))


__all__ = ["TaskGroup", "ImageTextBatch", "collate", "make_collate"]
