"""Batches: images once per item, text rows grouped by task.

A batch holds M images and, for each task present, one `TaskGroup` of text rows right-padded to the group's
own longest row: VQA rows are short and caption rows long, and padding them to one length would double the
decoder's work. Everything the training step needs to know about its targets (their flat positions, their
ids, how many) is computed here, on the CPU, so the step itself never waits for the device to report a
count (one host sync per logged step, not a dozen per step).

With `pad_multiple` > 1 the row count, the length and the target count of each group are padded up to a
multiple of it (padding rows attend to image 0, padding targets have label -100 and count for nothing), so
`torch.compile` sees a handful of shapes in an epoch instead of a new one every batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import torch

IGNORE = -100  # cross_entropy's ignore_index: a padding target


@dataclass
class TaskGroup:
    """The rows of one task in a batch. Tensors are [B, T] / [B] / [K]; B and T as padded."""

    task: str
    input_ids: torch.Tensor  # [B, T] long: prompt + target, right-padded
    loss_mask: torch.Tensor  # [B, T] bool: True on target tokens
    attention_mask: torch.Tensor  # [B, T] bool: True on real tokens
    image_index: torch.Tensor  # [B] long: row -> image of the batch
    prompt_len: torch.Tensor  # [B] long
    target_pos: torch.Tensor  # [K] long: flat positions in [B * (T-1)] whose next token is a target
    target_ids: torch.Tensor  # [K] long: those targets (IGNORE for padding)
    n_targets: int  # real targets among the K
    meta: list[dict] = field(default_factory=list)  # per real row: ids and references for evaluation
    rows: int = 0  # real rows among the B

    def to(self, device, non_blocking: bool = False) -> TaskGroup:
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for k, v in moved.items():
            if torch.is_tensor(v):
                moved[k] = v.to(device, non_blocking=non_blocking)
        return TaskGroup(**moved)

    def pin_memory(self) -> TaskGroup:
        return TaskGroup(**{f.name: (v.pin_memory() if torch.is_tensor(v) else v)
                            for f in fields(self) for v in [getattr(self, f.name)]})

    def prompts(self) -> list[list[int]]:
        """The prompt token ids of each real row."""
        return [self.input_ids[i, : int(self.prompt_len[i])].tolist() for i in range(self.rows)]


@dataclass
class PackedRows:
    """A training batch's text rows packed: a row holds rows of one image end to end (its questions and
    captions), each a segment with its own positions from 0 that attends causally within itself only
    (`vqa.model.masks.segment_mask`). The decoder computes what it computes for the rows one by one, but one
    decoder pass serves every task, little of the batch is padding, and the image's cross-attention
    keys/values are read in place (row m = image m, `image_index` None) or copied once per packed row, not per
    question (`plan_rows` decides). With `vqa.data.packing.pack_across` a row holds segments of several images
    instead, and `image_tokens` / `token_slots` send each token to its own image's keys/values (the
    cross-attention core runs image-major, `vqa.model.attention.ImageRoute`). Tensors are [R, T] / [K]."""

    input_ids: torch.Tensor  # [R, T] long
    positions: torch.Tensor  # [R, T] long: each token's position in its segment (0 on padding)
    segments: torch.Tensor  # [R, T] long: 1, 2, ... the segment of each token; 0 on padding
    target_pos: torch.Tensor  # [K] long: flat positions in [R * (T-1)] whose next token is a target
    target_ids: torch.Tensor  # [K] long: those targets (IGNORE for padding)
    target_task: torch.Tensor  # [K] long: the target's task, an index into `tasks`
    tasks: tuple[str, ...]
    task_targets: dict[str, int]  # real targets per task
    image_index: torch.Tensor | None = None  # [R] long: packed row -> image; None: row m is image m
    image_tokens: torch.Tensor | None = None  # [M, L] long: image m's tokens as flat positions in [R * T] (padded)
    token_slots: torch.Tensor | None = None  # [R * T] long: each token's place in [M * L] (padding: any)

    def to(self, device, non_blocking: bool = False) -> PackedRows:
        return PackedRows(**{f.name: (v.to(device, non_blocking=non_blocking) if torch.is_tensor(v) else v)
                             for f in fields(self) for v in [getattr(self, f.name)]})

    def pin_memory(self) -> PackedRows:
        return PackedRows(**{f.name: (v.pin_memory() if torch.is_tensor(v) else v)
                             for f in fields(self) for v in [getattr(self, f.name)]})

    @property
    def real_tokens(self) -> int:
        return int((self.segments > 0).sum())


@dataclass
class Batch:
    images: torch.Tensor  # [M, 3, S, S] uint8: normalized on the device (`vqa.data.transforms.ImageNormalizer`)
    groups: list[TaskGroup]  # empty when the rows are packed
    jitter: torch.Tensor | None = None  # [M, 2] float: training's brightness and contrast factors per image
    packed: PackedRows | None = None  # training's layout (`collate(pack=True)`): every row of the batch

    @property
    def num_images(self) -> int:
        return int(self.images.shape[0])

    def group(self, task: str) -> TaskGroup | None:
        return next((g for g in self.groups if g.task == task), None)

    def pin_memory(self) -> Batch:  # DataLoader(pin_memory=True) calls this
        return Batch(self.images.pin_memory(), [g.pin_memory() for g in self.groups],
                     None if self.jitter is None else self.jitter.pin_memory(),
                     None if self.packed is None else self.packed.pin_memory())


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple if multiple > 1 else n


def _group(task: str, rows: list[dict], image_index: list[int], pad_id: int, multiple: int) -> TaskGroup:
    n = len(rows)
    t = _round_up(max(len(r["input_ids"]) for r in rows), multiple)
    b = _round_up(n, multiple)
    # padded in Python, then one tensor each: a tensor per row costs more than the padding at ~200 rows a batch
    ids, attn, loss = [], [], []
    for r in rows:
        pad = t - len(r["input_ids"])
        ids.append([*r["input_ids"], *[pad_id] * pad])
        attn.append([True] * len(r["input_ids"]) + [False] * pad)
        loss.append([*r["loss_mask"], *[False] * pad])
    for _ in range(b - n):
        ids.append([pad_id] * t)
        attn.append([False] * t)
        loss.append([False] * t)
    input_ids = torch.tensor(ids, dtype=torch.long).view(b, t)
    loss_mask = torch.tensor(loss, dtype=torch.bool).view(b, t)
    target_pos, target_ids, k = _targets(input_ids, loss_mask, multiple)
    return TaskGroup(
        task=task, input_ids=input_ids, loss_mask=loss_mask,
        attention_mask=torch.tensor(attn, dtype=torch.bool).view(b, t),
        image_index=torch.tensor(image_index + [0] * (b - n), dtype=torch.long),
        prompt_len=torch.tensor([r["prompt_len"] for r in rows] + [0] * (b - n), dtype=torch.long),
        target_pos=target_pos, target_ids=target_ids, n_targets=k,
        meta=[r["meta"] for r in rows], rows=n,
    )


def _targets(input_ids: torch.Tensor, loss_mask: torch.Tensor, multiple: int) -> tuple[torch.Tensor, ...]:
    """(target_pos [K'], target_ids [K'], k): the flat positions in [B * (T-1)] whose next token is a target and
    those tokens, K' = k padded up to `multiple` with ignored targets at position 0."""
    target_pos = loss_mask[:, 1:].reshape(-1).nonzero().squeeze(1)  # [K]
    target_ids = input_ids[:, 1:].reshape(-1)[target_pos]
    k = int(target_pos.numel())
    kp = _round_up(k, multiple)
    if kp > k:  # padding targets: any position, ignored by the loss
        target_pos = torch.cat([target_pos, target_pos.new_zeros(kp - k)])
        target_ids = torch.cat([target_ids, target_ids.new_full((kp - k,), IGNORE)])
    return target_pos, target_ids, k


def plan_rows(lengths: list[list[int]], multiple: int = 1) -> tuple[int, list[list[list[int]]]]:
    """Where packing puts each text row: `lengths[m]` are image m's row lengths; returns (T, rows) with rows[m]
    a list of packed rows of image m, each a list of its row numbers. A packed row holds rows of one image only
    (it cross-attends to that image), T tokens at most. T is chosen among the images' totals (at least the
    longest row; of more than 32 images, the totals at 32 evenly spaced ranks and the largest) to pad the
    least, the shorter on a tie: when images carry similar totals every image fits in one packed row, and an
    image with many more questions than the others takes two or three instead of widening every row."""
    totals = sorted(sum(ls) for ls in lengths)
    longest = max((n for ls in lengths for n in ls), default=1)
    picks = ({totals[len(totals) * q // 32] for q in range(32)} | {totals[-1]}) if totals else {1}
    best = None
    for cap in sorted({_round_up(max(longest, c, 1), multiple) for c in picks}):
        plan = [_first_fit(ls, cap) for ls in lengths]
        padded = sum(len(p) for p in plan) * cap
        if best is None or padded < best[0]:
            best = (padded, cap, plan)
    return best[1], best[2]


def _first_fit(lengths: list[int], cap: int) -> list[list[int]]:
    """Rows 0..n-1 of these lengths into bins of `cap` tokens: longest first, each into the first bin with room."""
    bins: list[list[int]] = []
    room: list[int] = []
    for j in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
        n = lengths[j]
        b = next((i for i, r in enumerate(room) if r >= n), None)
        if b is None:
            bins.append([])
            room.append(cap)
            b = len(bins) - 1
        bins[b].append(j)
        room[b] -= n
    return [sorted(b) for b in bins]


def pack(items: list[dict], pad_id: int, pad_multiple: int = 1) -> PackedRows:
    """The items' text rows packed (`PackedRows`, `plan_rows`); T (and K, and more rows than images) padded to
    `pad_multiple`."""
    t, plan = plan_rows([[len(r["input_ids"]) for r in item["rows"]] for item in items], pad_multiple)
    packed = [(m, [items[m]["rows"][j] for j in row]) for m, rows in enumerate(plan) for row in rows]
    if not packed or len(packed) > len(items):  # rows != images: each packed row names its image, padded
        packed += [(0, [])] * (_round_up(len(packed), pad_multiple) - len(packed))
    one_per_image = len(packed) == len(items)
    return fill_rows(items, [rs for _, rs in packed], t, pad_id, pad_multiple,
                     image_index=None if one_per_image else torch.tensor([i for i, _ in packed], dtype=torch.long))


def fill_rows(items: list[dict], packed: list[list[dict]], t: int, pad_id: int, pad_multiple: int = 1,
              **extra) -> PackedRows:
    """`PackedRows` of these packed rows (each a list of text rows laid end to end), right-padded to T = `t`;
    `extra`: the fields that say which image each row's tokens attend to."""
    tasks = tuple(dict.fromkeys(r["task"] for item in items for r in item["rows"]))
    ids, pos, seg, loss, task_of = [], [], [], [], []
    for rs in packed:
        n = sum(len(r["input_ids"]) for r in rs)
        ids.append([tok for r in rs for tok in r["input_ids"]] + [pad_id] * (t - n))
        pos.append([p for r in rs for p in range(len(r["input_ids"]))] + [0] * (t - n))
        seg.append([j + 1 for j, r in enumerate(rs) for _ in r["input_ids"]] + [0] * (t - n))
        loss.append([m for r in rs for m in r["loss_mask"]] + [False] * (t - n))
        task_of.append([tasks.index(r["task"]) for r in rs for _ in r["input_ids"]] + [0] * (t - n))
    m = len(packed)
    input_ids = torch.tensor(ids, dtype=torch.long).view(m, t)
    loss_mask = torch.tensor(loss, dtype=torch.bool).view(m, t)
    target_pos, target_ids, k = _targets(input_ids, loss_mask, pad_multiple)
    # the target at flat position j of [M, T-1] is token j+1 of its row: predicted from the position before it,
    # in the same segment (a segment starts with <bos> or a prompt token, never a target)
    task_flat = torch.tensor(task_of, dtype=torch.long).view(m, t)[:, 1:].reshape(-1)
    target_task = task_flat[target_pos]
    target_task[k:] = 0
    counts = {name: int((target_task[:k] == i).sum()) for i, name in enumerate(tasks)}
    return PackedRows(input_ids=input_ids, positions=torch.tensor(pos, dtype=torch.long).view(m, t),
                      segments=torch.tensor(seg, dtype=torch.long).view(m, t), target_pos=target_pos,
                      target_ids=target_ids, target_task=target_task, tasks=tasks, task_targets=counts, **extra)


def collate(items: list[dict], pad_id: int, pad_multiple: int = 1, pack_rows: bool | Callable = False) -> Batch:
    """Items (dict(image=uint8 [3,S,S], rows=[dict(input_ids, loss_mask, task, meta, prompt_len)], and in
    training jitter=[2])) -> a Batch: the images stacked once, the rows grouped by task in order of first
    appearance, or with `pack_rows` packed (`PackedRows`, training's layout): True packs one row per image
    (`pack`), a function packs as it does (`vqa.data.packing.pack_across`: rows across images)."""
    images = torch.stack([item["image"] for item in items]) if items else torch.empty(0)
    jitter = torch.stack([item["jitter"] for item in items]) if items and "jitter" in items[0] else None
    if pack_rows:
        if not any(item["rows"] for item in items):
            return Batch(images=images, groups=[], jitter=jitter)
        packer = pack if pack_rows is True else pack_rows
        return Batch(images=images, groups=[], jitter=jitter, packed=packer(items, pad_id, pad_multiple))
    by_task: dict[str, tuple[list[dict], list[int]]] = {}
    for k, item in enumerate(items):
        for row in item["rows"]:
            rows, index = by_task.setdefault(row["task"], ([], []))
            rows.append(row)
            index.append(k)
    groups = [_group(task, rows, index, pad_id, pad_multiple) for task, (rows, index) in by_task.items()]
    return Batch(images=images, groups=groups, jitter=jitter)


def make_collate(pad_id: int, pad_multiple: int = 1, pack_rows: bool | Callable = False) -> Callable[[list[dict]], Batch]:
    """A picklable collate function for DataLoader workers."""
    return functools.partial(collate, pad_id=pad_id, pad_multiple=pad_multiple, pack_rows=pack_rows)


__all__ = ["TaskGroup", "PackedRows", "Batch", "collate", "pack", "fill_rows", "plan_rows", "make_collate", "IGNORE"]
