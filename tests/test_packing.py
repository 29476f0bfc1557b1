"""Training's packed layout (vqa.data.collate.PackedRows): one row per image, each question and caption a causal
segment of it, computes exactly what the task groups compute, reads each image's keys/values in place, and is
mostly real tokens."""

from __future__ import annotations

import random
from dataclasses import fields

import pytest
import torch
from helpers import random_images, tiny_model
from torch.utils._python_dispatch import TorchDispatchMode

from vqa.data.collate import IGNORE, collate, make_collate, pack, plan_rows
from vqa.model.masks import segment_mask
from vqa.train.objective import Objective


def items(model, seed: int, n_images: int = 3):
    """Images with 1-4 VQA rows (prompt 3-8, answer 1-3) and 0-2 captions (prompt 2, caption 4-12) each, in a
    mixed order, as the dataset gives them."""
    g = torch.Generator().manual_seed(seed)
    r = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))  # noqa: E731
    images = random_images(n_images, model.cfg)
    out = []
    for k in range(n_images):
        rows = []
        for task, p, t in [("vqa", r(3, 8), r(1, 3)) for _ in range(r(1, 4))] + [("caption", 2, r(4, 12))
                                                                                 for _ in range(r(0, 2))]:
            ids = torch.randint(3, model.cfg.vocab_size, (p + t,), generator=g).tolist()
            rows.append(dict(input_ids=ids, loss_mask=[False] * p + [True] * t, task=task, meta={}, prompt_len=p))
        out.append(dict(image=images[k], rows=rows[::-1] if k % 2 else rows))
    return out


def test_segment_mask_is_causal_within_each_segment_only():
    seg = torch.tensor([[1, 1, 1, 2, 2, 0, 0]])
    m = segment_mask(seg)[0, 0]
    expected = torch.tensor([[1, 0, 0, 0, 0, 0, 0],
                             [1, 1, 0, 0, 0, 0, 0],
                             [1, 1, 1, 0, 0, 0, 0],
                             [0, 0, 0, 1, 0, 0, 0],
                             [0, 0, 0, 1, 1, 0, 0],
                             [0, 0, 0, 0, 0, 1, 0],
                             [0, 0, 0, 0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(m, expected)


def segments_by_image(p, n_images: int) -> list[list[list[int]]]:
    """Each image's text rows as packed (token lists, sorted), read back from the packed tensors."""
    out = [[] for _ in range(n_images)]
    index = p.image_index.tolist() if p.image_index is not None else list(range(n_images))
    for r, m in enumerate(index):
        for s in range(1, int(p.segments[r].max()) + 1):
            at = (p.segments[r] == s).nonzero().squeeze(1)
            out[m].append(p.input_ids[r, at].tolist())
            assert p.positions[r, at].tolist() == list(range(len(at)))  # each segment counts from 0
            assert at.tolist() == list(range(int(at[0]), int(at[0]) + len(at)))  # and is contiguous
    return [sorted(x) for x in out]


@pytest.mark.parametrize("seed", [0, 4])
def test_packed_rows_hold_every_row_with_its_positions_segments_and_targets(seed):
    model = tiny_model()
    its = items(model, seed=seed, n_images=6)
    p = collate(its, pad_id=0, pack_rows=True).packed
    assert segments_by_image(p, len(its)) == [sorted(r["input_ids"] for r in item["rows"]) for item in its]
    assert not p.input_ids[p.segments == 0].any() and not p.positions[p.segments == 0].any()  # 0 on padding
    groups = collate(its, pad_id=0).groups
    assert p.task_targets == {g.task: g.n_targets for g in groups}
    assert p.real_tokens == sum(int(g.attention_mask.sum()) for g in groups)
    # each target is the token after its flat position, and carries its row's task
    flat_next = p.input_ids[:, 1:].reshape(-1)
    assert torch.equal(flat_next[p.target_pos], p.target_ids)
    task_names = [p.tasks[i] for i in p.target_task.tolist()]
    assert task_names.count("vqa") == p.task_targets["vqa"]


@pytest.mark.parametrize("multiple", [1, 8])
def test_packed_loss_and_gradients_equal_the_task_groups(multiple):
    """Same batch, both layouts, float64: the summed weighted loss and every gradient agree to 1e-10."""
    model = tiny_model().double()
    its = items(model, seed=1, n_images=4)
    for it in its:
        it["image"] = it["image"].double()
    grouped, packed = collate(its, pad_id=0), collate(its, pad_id=0, pad_multiple=multiple, pack_rows=True)
    assert packed.packed.input_ids.shape[1] % multiple == 0 and packed.packed.target_ids.numel() % multiple == 0
    objective = Objective(model)
    losses, grads = [], []
    for rows, weights in ((grouped.groups, [1.0, 0.3]), (packed.packed, [1.0, 0.3])):
        model.zero_grad()
        loss = objective(grouped.images, rows, weights)
        loss.backward()
        losses.append(loss.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert float(losses[1]) == pytest.approx(float(losses[0]), rel=1e-6)
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], atol=1e-10, rtol=1e-8, msg=n)


class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("seed", [2, 5, 6])
def test_packing_pads_less_than_task_groups(seed):
    """Rows of very different lengths and counts per image: task groups pad each row to its group's longest,
    packing pads each packed row only, and splits an image with many rows in two rather than widen them all."""
    model = tiny_model()
    its = items(model, seed=seed, n_images=16)
    grouped, packed = collate(its, pad_id=0), collate(its, pad_id=0, pack_rows=True)
    real = packed.packed.real_tokens
    frac_groups = real / sum(g.input_ids.numel() for g in grouped.groups)
    frac_packed = real / packed.packed.input_ids.numel()
    assert frac_packed > frac_groups


def test_images_with_like_rows_pack_one_row_each_and_copy_no_keys():
    """Every image with the same row lengths: one packed row per image, whose cross-attention reads the image's
    keys/values in place, where task groups gather them for every row (2 x layers index_selects a group; the
    one left is the LM head's rows at the targets)."""
    model = tiny_model()
    its = items(model, seed=7, n_images=4)
    for it in its[1:]:
        it["rows"] = its[0]["rows"]
    grouped, packed = collate(its, pad_id=0), collate(its, pad_id=0, pack_rows=True)
    assert packed.packed.image_index is None and packed.packed.input_ids.shape[0] == 4
    assert packed.packed.real_tokens == packed.packed.input_ids.numel()
    depth = model.cfg.dec_depth
    for rows, selects in ((grouped.groups, 2 * (2 * depth + 1)), (packed.packed, 1)):
        with torch.no_grad(), Ops() as ops:
            Objective(model)(grouped.images, rows, [1.0, 1.0])
        assert sum(n.startswith("index_select") for n in ops.names) == selects


def test_an_image_without_rows_gets_no_packed_row():
    model = tiny_model()
    its = items(model, seed=3, n_images=3)
    its[1]["rows"] = []
    p = collate(its, pad_id=0, pack_rows=True, pad_multiple=8).packed
    assert p.image_index is not None and p.input_ids.shape[0] % 8 == 0
    real_rows = p.segments.any(1)
    assert 1 not in p.image_index[real_rows].tolist()
    assert not p.input_ids[~real_rows].any()
    assert p.target_ids[p.target_ids != IGNORE].numel() == sum(p.task_targets.values())
    assert collate([dict(image=its[1]["image"], rows=[])], pad_id=0, pack_rows=True).packed is None


@pytest.mark.parametrize("lengths", [[[5, 5], [5, 5]], [[3, 9, 2], [20], [4]], [[7] * 6, [7], [7, 7]]])
def test_plan_rows_places_every_row_once_and_within_the_length(lengths):
    t, plan = plan_rows(lengths)
    assert t >= max(n for ls in lengths for n in ls)
    for ls, rows in zip(lengths, plan, strict=True):
        assert sorted(j for row in rows for j in row) == list(range(len(ls)))
        assert all(sum(ls[j] for j in row) <= t for row in rows)


def _fields(p) -> dict:
    return {f.name: getattr(p, f.name) for f in fields(p)}


def _same_packed(a, b):
    """Every field of two PackedRows equal (tensors by value and dtype)."""
    fa, fb = _fields(a), _fields(b)
    assert fa.keys() == fb.keys()
    for name, x in fa.items():
        y = fb[name]
        if torch.is_tensor(x):
            assert torch.is_tensor(y) and x.dtype == y.dtype and torch.equal(x, y), name
        else:
            assert x == y, name


def _split_packed():
    """A packed batch with every field set: an image without rows makes `image_index` a tensor."""
    model = tiny_model()
    its = items(model, seed=3, n_images=3)
    its = [{**it, "rows": [] if k == 1 else it["rows"], "jitter": torch.tensor([1.0, 1.0])} for k, it in enumerate(its)]
    batch = collate(its, pad_id=0, pack_rows=True, pad_multiple=4)
    assert batch.packed.image_index is not None and batch.jitter is not None
    return batch


def test_packed_rows_move_every_tensor_and_keep_the_rest(monkeypatch):
    """PackedRows.to: every tensor field goes to the device asked for, with the non_blocking asked for (the meta
    device stands in for a GPU: only the device changes); the task names and counts travel as they are."""
    p = _split_packed().packed
    tensors = {k for k, v in _fields(p).items() if torch.is_tensor(v)}
    assert tensors == {"input_ids", "positions", "segments", "target_pos", "target_ids", "target_task",
                       "image_index"}
    moved = p.to("meta")
    for name, v in _fields(moved).items():
        if name in tensors:
            orig = getattr(p, name)
            assert v.device.type == "meta" and v.shape == orig.shape and v.dtype == orig.dtype, name
        else:
            assert v == getattr(p, name), name
    _same_packed(p.to("cpu"), p)
    _moves_with_the_non_blocking_asked_for(p, len(tensors), monkeypatch)


def _moves_with_the_non_blocking_asked_for(rows, n_tensors: int, monkeypatch):
    """`rows.to("cpu", ...)` calls Tensor.to once per tensor field with the device and the non_blocking asked
    for, False when not asked (a copy that may overlap the host only when the caller says so)."""
    calls = []
    real_to = torch.Tensor.to

    def spy(t, *args, **kwargs):
        calls.append((args, kwargs.get("non_blocking")))
        return real_to(t, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", spy)
    for asked in (True, False):
        calls.clear()
        rows.to("cpu", non_blocking=asked)
        assert calls == [(("cpu",), asked)] * n_tensors
    calls.clear()
    rows.to("cpu")
    assert calls == [(("cpu",), False)] * n_tensors  # blocking unless asked


def test_task_groups_move_with_the_non_blocking_asked_for(monkeypatch):
    g = collate(items(tiny_model(), seed=2), pad_id=0).groups[0]
    _moves_with_the_non_blocking_asked_for(g, sum(torch.is_tensor(v) for v in vars(g).values()), monkeypatch)


def test_segment_mask_is_built_on_the_segments_device():
    """The mask is made where the segments are (the meta device stands in for a GPU: a causal part left on
    the CPU cannot be combined with meta tensors)."""
    seg = torch.tensor([[1, 1, 2, 0], [1, 2, 2, 2]])
    m = segment_mask(seg.to("meta"))
    assert m.device.type == "meta" and m.shape == (2, 1, 4, 4) and m.dtype == torch.bool
    assert torch.equal(segment_mask(seg)[1, 0], torch.tensor([[1, 0, 0, 0], [0, 1, 0, 0], [0, 1, 1, 0],
                                                              [0, 1, 1, 1]], dtype=torch.bool))


def test_make_collate_passes_pack_rows():
    its = items(tiny_model(), seed=2)
    for pack_rows in (True, False):
        got, want = make_collate(0, pad_multiple=4, pack_rows=pack_rows)(its), collate(its, 0, 4, pack_rows)
        assert (got.packed is None) == (not pack_rows) and len(got.groups) == (0 if pack_rows else 2)
        if pack_rows:
            _same_packed(got.packed, want.packed)


def test_packed_batch_pins_every_tensor(monkeypatch):
    """Batch.pin_memory with packed rows: the images, the jitter and every packed tensor are pinned once each
    (pin_memory needs an accelerator: a stand-in records each tensor it was asked to pin, returns a copy)."""
    batch = _split_packed()
    pinned = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: pinned.append(t) or t.clone())
    out = batch.pin_memory()
    p, q = batch.packed, out.packed
    want = [batch.images, batch.jitter] + [v for v in _fields(p).values() if torch.is_tensor(v)]
    assert sorted(map(id, pinned)) == sorted(map(id, want))  # each tensor, once
    _same_packed(q, p)
    for name, v in _fields(q).items():
        if torch.is_tensor(v):
            assert v is not getattr(p, name), name  # the pinned copy, not the original
    assert torch.equal(out.images, batch.images) and torch.equal(out.jitter, batch.jitter)
    assert out.groups == [] and out.images is not batch.images and out.jitter is not batch.jitter


# where packing puts each row, against a plan written out from its definition; the corner cases of pack
def first_fit_decreasing(lengths: list[int], cap: int) -> list[list[int]]:
    """Rows into bins of `cap` tokens: the longest row first (equal lengths in row order), each into the first
    bin it fits in, else a new bin; each bin's row numbers in order."""
    order = sorted(range(len(lengths)), key=lambda j: (-lengths[j], j))
    bins, used = [], []
    for j in order:
        for b in range(len(bins)):
            if used[b] + lengths[j] <= cap:
                bins[b].append(j)
                used[b] += lengths[j]
                break
        else:
            bins.append([j])
            used.append(lengths[j])
    return [sorted(b) for b in bins]


def reference_plan(lengths: list[list[int]], multiple: int) -> tuple[int, list[list[list[int]]]]:
    """The candidate T: each image's total (the longest row if that is longer), rounded up to `multiple`; with
    more than 32 images only the totals at ranks 0, n/32, 2n/32, ... of the sorted totals, and the largest. The
    one whose plan has the fewest padded tokens (rows x T) wins, the shorter on a tie."""
    longest = max(n for ls in lengths for n in ls)
    totals = sorted(sum(ls) for ls in lengths)
    if len(totals) > 32:
        totals = [totals[i] for i in range(len(totals)) if any(len(totals) * q // 32 == i for q in range(32))
                  or i == len(totals) - 1]
    caps = sorted({-(-max(c, longest) // multiple) * multiple for c in totals})
    scored = [(sum(len(first_fit_decreasing(ls, c)) for ls in lengths) * c, c) for c in caps]
    t = min(scored)[1]
    return t, [first_fit_decreasing(ls, t) for ls in lengths]


def random_lengths(rng: random.Random, n_images: int) -> list[list[int]]:
    """Images with 0-9 rows of 1-14 tokens, some with many more rows than the rest."""
    out = [[rng.choice([1, 2, 3, 5, 5, 7, 10, 14]) for _ in range(rng.choice([0, 1, 2, 3, 3, 4, 9]))]
           for _ in range(n_images)]
    if not any(out):
        out[0] = [4]
    return out


@pytest.mark.parametrize("multiple", [1, 2, 8])
def test_plan_rows_equals_first_fit_decreasing_at_the_least_padded_length(multiple):
    rng = random.Random(multiple)
    differs = 0
    for trial in range(150):
        lengths = random_lengths(rng, rng.randint(1, 12) if trial % 3 else rng.randint(33, 80))
        t, plan = plan_rows(lengths, multiple)
        assert (t, plan) == reference_plan(lengths, multiple), lengths
        differs += t < max(sum(ls) for ls in lengths)  # the premise: not all one packed row per image
    assert differs > 20


@pytest.mark.parametrize("lengths, multiple, want", [
    ([[1], [1]], 1, (1, [[[0]], [[0]]])),  # one-token rows: T = 1 pads nothing
    ([[5, 5], [10]], 1, (10, [[[0, 1]], [[0]]])),  # a row that fills the room left exactly shares the row
    ([[5, 5], [5]], 1, (5, [[[0], [1]], [[0]]])),  # 3 x 5 tokens beat 2 x 10
    ([[6, 6, 4], [2, 6]], 1, (8, [[[0], [1], [2]], [[0, 1]]])),  # 4 x 8 or 2 x 16 tokens: the shorter T
    ([[6, 4, 4, 6]], 1, (20, [[[0, 1, 2, 3]]])),  # T = 6 would pad 4 rows to 24 tokens
    ([[3], [3]], 8, (8, [[[0]], [[0]]])),
    ([[9, 2], [], [4]], 4, (12, [[[0, 1]], [], [[0]]])),  # an image without rows gets no packed row
])
def test_plan_rows_known_cases(lengths, multiple, want):
    got = plan_rows(lengths) if multiple == 1 else plan_rows(lengths, multiple)  # 1: the default
    assert got == want == reference_plan(lengths, multiple)


def test_pack_called_directly_equals_collates_packed_rows():
    """pack's own default is no padding, as collate's: a direct call gives collate's packed rows (here T is odd,
    so a default that rounded T up would show)."""
    its = items(tiny_model(), seed=2, n_images=3)
    want = collate(its, pad_id=0, pack_rows=True).packed
    assert want.input_ids.shape[1] % 2 == 1
    _same_packed(pack(its, pad_id=0), want)
    _same_packed(pack(its, 0, 8), collate(its, pad_id=0, pad_multiple=8, pack_rows=True).packed)


def test_one_row_per_image_is_not_padded_to_the_multiple():
    """Three images whose rows fit one packed row each: row m is image m (no index, no padding rows) even with
    pad_multiple 8; T and the targets are padded to 8."""
    its = items(tiny_model(), seed=7, n_images=3)
    for it in its[1:]:
        it["rows"] = its[0]["rows"]
    p = collate(its, pad_id=0, pad_multiple=8, pack_rows=True).packed
    assert p.image_index is None and p.input_ids.shape[0] == 3
    assert p.input_ids.shape[1] % 8 == 0 and p.target_pos.numel() % 8 == 0


def _row(task, prompt, target):
    return dict(input_ids=prompt + target, loss_mask=[False] * len(prompt) + [True] * len(target), task=task, meta={},
                prompt_len=len(prompt))


def test_an_image_split_in_two_packed_rows_pads_rows_that_read_image_0_and_add_nothing():
    """An image with two rows of 5 tokens and one with a row of 5, pad_multiple 8: three packed rows of 8 (24
    tokens, not 2 x 16), padded to 8 rows that read image 0 (as the module says); loss and gradients equal the
    task groups'."""
    model = tiny_model().double()
    images = random_images(2, model.cfg).double()
    its = [dict(image=images[0], rows=[_row("vqa", [1, 5, 6], [7, 2]), _row("vqa", [1, 8, 9], [10, 2])]),
           dict(image=images[1], rows=[_row("caption", [1, 4], [11, 12, 2])])]
    p = collate(its, pad_id=0, pad_multiple=8, pack_rows=True).packed
    assert p.input_ids.shape == (8, 8) and p.image_index.tolist() == [0, 0, 1] + [0] * 5
    assert p.segments.any(1).tolist() == [True] * 3 + [False] * 5
    grouped = collate(its, pad_id=0)
    objective, losses, grads = Objective(model), [], []
    for rows in (grouped.groups, p):
        model.zero_grad()
        loss = objective(grouped.images, rows, [1.0, 1.0])
        loss.backward()
        losses.append(float(loss.detach()))
        grads.append([q.grad.clone() for q in model.parameters() if q.grad is not None])
    assert losses[1] == pytest.approx(losses[0], rel=1e-9)
    for a, b in zip(grads[0], grads[1], strict=True):
        torch.testing.assert_close(b, a, atol=1e-10, rtol=1e-8)


def test_pack_of_images_without_rows_gives_empty_tensors_of_the_right_types():
    """pack called directly on images without text rows (collate does not call it then): no packed row, every
    tensor long even when empty (torch.tensor([]) alone would be float)."""
    image = torch.zeros(3, 8, 8, dtype=torch.uint8)
    assert pack([], pad_id=0).input_ids.shape[0] == 0  # no images at all
    p = pack([dict(image=image, rows=[]), dict(image=image, rows=[])], pad_id=0, pad_multiple=4)
    assert p.input_ids.shape[0] == 0 and p.tasks == () and p.task_targets == {} and p.real_tokens == 0
    for name in ("input_ids", "positions", "segments", "target_pos", "target_ids", "target_task", "image_index"):
        v = getattr(p, name)
        assert v.dtype == torch.long and v.numel() == 0, name
