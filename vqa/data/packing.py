"""Training's layout: every question and caption of a batch packed end to end into rows that mix images, as
`vqa.model.packed.PackedRows` (what the model's training forward consumes, and where the layout is described).

Each text row of the batch goes, longest first, into the fullest packed row it fits (best-fit decreasing), for
the row length T that pads least, so little but the last row is padding whatever the questions per image.
A text row is a segment: never split, so it computes what it computes alone.

Everything the step needs about its targets (flat positions, ids, task weights, their sum) is computed here,
on the CPU, so the step never waits for the device to report a count.
"""

from __future__ import annotations

import numpy as np
import torch

from ..model.packed import IGNORE, PackedRows

MAX_LEN = 128  # the longest packed row tried (or the longest text row, if longer): self-attention grows with T


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple if multiple > 1 else n


def targets(input_ids: torch.Tensor, loss_mask: torch.Tensor, multiple: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(target_pos [K'], target_ids [K'], k): the flat positions in [R * (T-1)] whose next token is a target and
    those tokens, K' = k (at least 1: a batch without text still has a target) padded up to `multiple` with
    ignored targets at position 0."""
    target_pos = loss_mask[:, 1:].reshape(-1).nonzero().squeeze(1)  # [K]
    target_ids = input_ids[:, 1:].reshape(-1)[target_pos]
    k = int(target_pos.numel())
    kp = round_up(max(k, 1), multiple)
    if kp > k:  # padding targets: any position, ignored by the loss
        target_pos = torch.cat([target_pos, target_pos.new_zeros(kp - k)])
        target_ids = torch.cat([target_ids, target_ids.new_full((kp - k,), IGNORE)])
    return target_pos, target_ids, k


def plan(lengths: list[list[int]], multiple: int = 1,
         max_len: int = MAX_LEN) -> tuple[int, list[list[tuple[int, int]]]]:
    """Where each text row goes: `lengths[m]` are image m's row lengths; returns (T, rows), each packed row a
    list of (image, row number), every text row in exactly one, none longer than T in all. Candidate lengths
    are the longest row and multiples of 8 up to `max_len`; for each, best-fit decreasing fills the rows, and
    the plan with the fewest tokens (T padded up to `multiple`) wins, the shorter T on a tie."""
    segs = sorted(((n, m, j) for m, ls in enumerate(lengths) for j, n in enumerate(ls)), key=lambda s: -s[0])
    if not segs:  # two tokens: the one padding target needs a position before it
        return round_up(2, multiple), []
    longest, total = segs[0][0], sum(s[0] for s in segs)
    step = round_up(8, multiple)
    candidates = ({round_up(longest, multiple)}
                  | set(range(round_up(longest, step), max(longest, max_len) + 1, step)))
    best = None
    for capacity in sorted(candidates):
        rows, fill = _best_fit(segs, capacity)
        t = round_up(max(fill), multiple)
        tokens = len(rows) * t
        if best is None or tokens < best[0]:
            best = (tokens, t, rows)
        if tokens == total:  # no padding at all: no longer T can do better
            break
    return best[1], best[2]


def _best_fit(segs: list[tuple[int, int, int]],
              capacity: int) -> tuple[list[list[tuple[int, int]]], list[int]]:
    """(rows, fill): segments (length, image, row), longest first, each into the row with the least room that
    holds it, a new row if none does. Rows are found by their room left: `free` has bit r set while some row
    has exactly r tokens of room, so the least room >= n is one bit operation."""
    rows: list[list[tuple[int, int]]] = []
    fill: list[int] = []
    by_room: list[list[int]] = [[] for _ in range(capacity + 1)]
    free = 0
    for n, m, j in segs:
        fits = free >> n
        if fits:
            room = n + (fits & -fits).bit_length() - 1
            r = by_room[room].pop()
            if not by_room[room]:
                free &= ~(1 << room)
        else:
            room, r = capacity, len(rows)
            rows.append([])
            fill.append(0)
        rows[r].append((m, j))
        fill[r] += n
        by_room[room - n].append(r)
        free |= 1 << (room - n)
    return rows, fill


def grounded(items: list[dict], layout: list[list[tuple[int, int]]], t: int, weight: float,
             multiple: int) -> dict:
    """PackedRows' ground_* fields from the rows' "regions" (`vqa.data.regions`), image-major as the
    cross-attention core runs: image m's grounded tokens as flat positions in [R * T], their targets and their
    weight `weight`, padded to the most any image has, a multiple of `multiple` (at least 1, so every step has
    the same graph). Empty when `weight` is 0."""
    if weight <= 0:
        return {}
    per_image: list[list[tuple[int, object]]] = [[] for _ in items]  # image m: (flat position, target [P])
    for r, row in enumerate(layout):
        at = r * t
        for m, j in row:
            text = items[m]["rows"][j]
            if "regions" in text:
                where, goals = text["regions"]
                per_image[m] += [(at + p, goal) for p, goal in zip(where, goals, strict=True)]
            at += len(text["input_ids"])
    width = round_up(max(max(map(len, per_image), default=1), 1), multiple)  # Lg
    cells = next((len(goal) for got in per_image for _, goal in got), 1)  # P
    tokens = torch.zeros(len(items), width, dtype=torch.long)
    target = torch.zeros(len(items), width, cells)
    weights = torch.zeros(len(items), width)
    for m, got in enumerate(per_image):
        if got:
            tokens[m, : len(got)] = torch.tensor([p for p, _ in got])
            target[m, : len(got)] = torch.as_tensor(np.stack([goal for _, goal in got]))
            weights[m, : len(got)] = weight
    return dict(ground_tokens=tokens, ground_target=target, ground_weight=weights)


def pack(items: list[dict], pad_id: int, task_weights: dict[str, float], pad_multiple: int = 1) -> PackedRows:
    """The items' text rows packed across images (`plan`), each target weighted by its task's entry of
    `task_weights` (its "grounding" entry, when above 0, the grounding loss's weight: `grounded`). T, L and
    the target count K are padded up to `pad_multiple`; the row count R is not
    (padding rows would cost a whole row each, and `torch.compile`'s automatic dynamic shapes take over R after
    its first change). Items without any text row give one padding row and one padding target: a zero loss
    that still reaches every parameter, so a step whose samples were all unusable runs like any other."""
    t, layout = plan([[len(r["input_ids"]) for r in item["rows"]] for item in items], pad_multiple)
    rows = [[items[m]["rows"][j] for m, j in row] for row in layout] or [[]]
    per_image: list[list[int]] = [[] for _ in items]  # image m's tokens: flat positions in [R * T], in order
    for r, row in enumerate(layout):
        at = r * t
        for m, j in row:
            n = len(items[m]["rows"][j]["input_ids"])
            per_image[m].extend(range(at, at + n))
            at += n
    width = round_up(max(max(map(len, per_image), default=1), 1), pad_multiple)  # L
    slots = [0] * (len(rows) * t)  # padding tokens read slot 0: any finite value, which reaches nothing
    for m, flat in enumerate(per_image):
        for i, f in enumerate(flat):
            slots[f] = m * width + i
    tokens = [flat + [0] * (width - len(flat)) for flat in per_image]  # padding queries: token 0, never read
    ids, pos, seg, loss, token_weight = [], [], [], [], []
    for rs in rows:
        n = sum(len(r["input_ids"]) for r in rs)
        ids.append([token_id for r in rs for token_id in r["input_ids"]] + [pad_id] * (t - n))
        pos.append([p for r in rs for p in range(len(r["input_ids"]))] + [0] * (t - n))
        seg.append([j + 1 for j, r in enumerate(rs) for _ in r["input_ids"]] + [0] * (t - n))
        loss.append([m for r in rs for m in r["loss_mask"]] + [False] * (t - n))
        token_weight.append([task_weights[r["task"]] for r in rs for _ in r["input_ids"]] + [0.0] * (t - n))
    input_ids = torch.tensor(ids, dtype=torch.long).view(len(rows), t)
    target_pos, target_ids, k = targets(input_ids, torch.tensor(loss, dtype=torch.bool).view(len(rows), t),
                                        pad_multiple)
    # the target at flat position j of [R, T-1] is token j+1 of its row (row j // (T-1), column j % (T-1) + 1)
    weights = [token_weight[j // (t - 1)][j % (t - 1) + 1] for j in target_pos[:k].tolist()]
    target_weight = torch.tensor(weights + [0.0] * (target_pos.numel() - k), dtype=torch.float32)
    ground = grounded(items, layout, t, task_weights.get("grounding", 0.0), pad_multiple)
    return PackedRows(**ground, input_ids=input_ids, positions=torch.tensor(pos, dtype=torch.long).view(len(rows), t),
                      segments=torch.tensor(seg, dtype=torch.long).view(len(rows), t), target_pos=target_pos,
                      target_ids=target_ids, target_weight=target_weight,
                      image_tokens=torch.tensor(tokens, dtype=torch.long).view(len(items), width),
                      token_slots=torch.tensor(slots, dtype=torch.long), weighted_targets=float(sum(weights)))


__all__ = ["MAX_LEN", "plan", "pack", "round_up", "targets"]
