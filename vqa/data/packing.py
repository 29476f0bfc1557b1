"""Rows packed across images: training's default layout.

`vqa.data.collate.pack` keeps a packed row to one image (its cross-attention reads that image's keys/values),
so every row is padded to a length chosen for the images' totals. Here a row holds segments of any images:
every text row of the batch goes, longest first, into the fullest packed row it fits (best-fit decreasing),
for the row length T that pads least, so little but the last row is padding whatever the questions per image.
Segments are never split; each keeps its own positions from 0 and its causal mask
(`vqa.model.masks.segment_mask`).

Cross-attention then needs each token's own image. The decoder keeps its projections in the packed layout and
runs only the attention core image-major (`vqa.model.attention.ImageRoute`): `image_tokens` [M, L] gathers
image m's tokens (its queries) from the flat [R * T] tokens, attention runs against image m's keys/values
[M, H, N, Dh] as the ViT computed them (no copy per row), and `token_slots` [R * T] puts each output back.
"""

from __future__ import annotations

import torch

from .collate import PackedRows, _round_up, fill_rows

MAX_LEN = 128  # the longest packed row tried (or the longest text row, if longer): self-attention grows with T


def plan_across(lengths: list[list[int]], multiple: int = 1,
                max_len: int = MAX_LEN) -> tuple[int, list[list[tuple[int, int]]]]:
    """Where cross-image packing puts each text row: `lengths[m]` are image m's row lengths; returns (T, rows),
    each packed row a list of (image, row number), every text row in exactly one, none longer than T in all.
    Candidate lengths are the longest row and multiples of 8 up to `max_len`; for each, best-fit decreasing
    fills the rows, and the plan with the fewest tokens (T padded up to `multiple`) wins, the shorter T on a
    tie."""
    segs = sorted(((n, m, j) for m, ls in enumerate(lengths) for j, n in enumerate(ls)), key=lambda s: -s[0])
    if not segs:
        return max(multiple, 1), []
    longest, total = segs[0][0], sum(s[0] for s in segs)
    step = _round_up(8, multiple)
    caps = {_round_up(longest, multiple)} | set(range(_round_up(longest, step), max(longest, max_len) + 1, step))
    best = None
    for cap in sorted(caps):
        rows, fill = _best_fit(segs, cap)
        t = _round_up(max(fill), multiple)
        tokens = len(rows) * t
        if best is None or tokens < best[0]:
            best = (tokens, t, rows)
        if tokens == total:  # no padding at all: no longer T can do better
            break
    return best[1], best[2]


def _best_fit(segs: list[tuple[int, int, int]], cap: int) -> tuple[list[list[tuple[int, int]]], list[int]]:
    """(rows, fill): segments (length, image, row), longest first, each into the row with the least room that
    holds it, a new row if none does. Rows are found by their room left: `free` has bit r set while some row
    has exactly r tokens of room, so the least room >= n is one bit operation."""
    rows: list[list[tuple[int, int]]] = []
    fill: list[int] = []
    by_room: list[list[int]] = [[] for _ in range(cap + 1)]
    free = 0
    for n, m, j in segs:
        fits = free >> n
        if fits:
            room = n + (fits & -fits).bit_length() - 1
            r = by_room[room].pop()
            if not by_room[room]:
                free &= ~(1 << room)
        else:
            room, r = cap, len(rows)
            rows.append([])
            fill.append(0)
        rows[r].append((m, j))
        fill[r] += n
        by_room[room - n].append(r)
        free |= 1 << (room - n)
    return rows, fill


def pack_across(items: list[dict], pad_id: int, pad_multiple: int = 1) -> PackedRows:
    """The items' text rows packed across images (`plan_across`), with each image's tokens listed for the
    image-major cross-attention: `image_tokens` [M, L] and `token_slots` [R * T]. T, L and the target count K
    are padded up to `pad_multiple`; the row count R is not (padding rows would cost a whole row each, and
    `torch.compile`'s automatic dynamic shapes take over R after its first change). Padding tokens are
    segment 0: they attend to padding only and count for nothing."""
    t, plan = plan_across([[len(r["input_ids"]) for r in item["rows"]] for item in items], pad_multiple)
    rows = [[items[m]["rows"][j] for m, j in row] for row in plan] or [[]]
    per_image: list[list[int]] = [[] for _ in items]  # image m's tokens: flat positions in [R * T], in order
    for r, row in enumerate(plan):
        at = r * t
        for m, j in row:
            n = len(items[m]["rows"][j]["input_ids"])
            per_image[m].extend(range(at, at + n))
            at += n
    width = _round_up(max(max(map(len, per_image), default=1), 1), pad_multiple)  # L
    slots = [0] * (len(rows) * t)  # padding tokens read slot 0: any finite value, which reaches nothing
    for m, flat in enumerate(per_image):
        for i, f in enumerate(flat):
            slots[f] = m * width + i
    tokens = [flat + [0] * (width - len(flat)) for flat in per_image]  # padding queries: token 0, never read
    return fill_rows(items, rows, t, pad_id, pad_multiple,
                     image_tokens=torch.tensor(tokens, dtype=torch.long).view(len(items), width),
                     token_slots=torch.tensor(slots, dtype=torch.long))


__all__ = ["MAX_LEN", "plan_across", "pack_across"]
