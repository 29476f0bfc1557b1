"""collate (vqa/data/collate.py) on the dataset's own items: evaluation's rows grouped by task, training's rows
packed with every target of the rows and no other (padding keeps them all), batches that pin every tensor,
make_collate's settings and the edge cases. The datasets come from data_fixtures.make, the `data` fixture from
conftest.py."""

from __future__ import annotations

import pickle

import torch
from data_fixtures import make
from helpers import tiny_model
from test_packing import items

from vqa.data.collate import collate, make_collate
from vqa.data.packing import pack, plan
from vqa.model.packed import IGNORE

WEIGHTS = {"vqa": 1.0, "caption": 0.5}


def _expected_targets(rows) -> list[tuple[tuple[int, ...], int, int]]:
    """The reference, from the rows alone: (row's ids, position p, token) for each target token, where the
    token is the row's token p+1 and the loss mask is set on it (the logits at p predict the token after p)."""
    return sorted((tuple(r["input_ids"]), p, r["input_ids"][p + 1]) for r in rows
                  for p in range(len(r["input_ids"]) - 1) if r["loss_mask"][p + 1])


def _targets(p) -> list[tuple[tuple[int, ...], int, int]]:
    """Packed rows' real targets as (their segment's ids, position in the segment, token), read back from the
    flat positions in [R, T-1]."""
    width = p.input_ids.shape[1] - 1
    out = []
    for j, tok in zip(p.target_pos.tolist(), p.target_ids.tolist(), strict=True):
        if tok == IGNORE:
            continue
        r, c = divmod(j, width)
        seg = (p.segments[r] == p.segments[r, c]).nonzero().squeeze(1)
        out.append((tuple(p.input_ids[r, seg].tolist()), c - int(seg[0]), tok))
    return sorted(out)


def test_collate_groups_evaluation_rows_by_task(data):
    _, _, tok = data
    ds = make(data, train=False)
    items = [ds[i] for i in range(3)]
    batch = collate(items, tok.pad_id)
    assert batch.images.shape == (3, 3, 64, 64) and batch.packed is None
    assert [g.task for g in batch.groups] == ["vqa", "caption"]  # in order of first appearance
    for g in batch.groups:
        rows = [(k, r) for k, it in enumerate(items) for r in it["rows"] if r["task"] == g.task]
        t = max(len(r["input_ids"]) for _, r in rows)  # each group is cut to its own longest row
        assert g.input_ids.shape == (len(rows), t)
        assert g.rows == len(rows) and g.meta == [r["meta"] for _, r in rows]
        assert g.prompts() == [r["input_ids"][: r["prompt_len"]] for _, r in rows]
        for b, (k, row) in enumerate(rows):
            n = len(row["input_ids"])
            assert g.image_index[b] == k and torch.equal(batch.images[k], items[k]["image"])
            assert g.input_ids[b, :n].tolist() == row["input_ids"]
            assert (g.input_ids[b, n:] == tok.pad_id).all()


def test_training_batches_hold_every_target_of_the_rows_padded_or_not(data):
    """The packed targets are the (row, position, token) triples of the rows themselves, with pad_multiple 8
    as without; padding targets are ignored and weigh nothing."""
    _, _, tok = data
    ds = make(data)
    items = [ds[i] for i in range(3)]
    want = _expected_targets([r for it in items for r in it["rows"]])
    plain = collate(items, tok.pad_id, task_weights=WEIGHTS).packed
    padded = collate(items, tok.pad_id, pad_multiple=8, task_weights=WEIGHTS).packed
    assert len(want) > 0 and _targets(plain) == _targets(padded) == want
    assert padded.input_ids.shape[1] % 8 == 0 and padded.target_pos.numel() % 8 == 0
    k = len(want)
    assert padded.target_pos.numel() > k  # the test needs padding targets
    assert (padded.target_ids[k:] == IGNORE).all() and not padded.target_weight[k:].any()
    assert plain.weighted_targets == padded.weighted_targets == sum(
        WEIGHTS[r["task"]] * sum(r["loss_mask"][1:]) for it in items for r in it["rows"])


def _same_group(a, b):
    """Every field of two TaskGroups equal (tensors by value and dtype)."""
    from dataclasses import fields

    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if torch.is_tensor(x):
            assert torch.is_tensor(y) and x.dtype == y.dtype and torch.equal(x, y), f.name
        else:
            assert x == y, f.name


def test_batches_pin_every_tensor(data, monkeypatch):
    _, _, tok = data
    ds = make(data)
    items = [ds[i] for i in range(3)]
    batch = collate(items, tok.pad_id)
    # pin_memory needs an accelerator: a stand-in that marks each tensor it was asked to pin
    pinned = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: pinned.append(t) or t.clone())
    p = batch.pin_memory()
    assert torch.equal(p.images, batch.images) and torch.equal(p.jitter, batch.jitter)
    for a, b in zip(p.groups, batch.groups, strict=True):
        _same_group(a, b)
    n_tensors = sum(torch.is_tensor(getattr(gr, f)) for gr in batch.groups for f in vars(gr))
    assert len(pinned) == 2 + n_tensors  # images, jitter and every tensor of every group
    assert "jitter" in items[0] and batch.jitter.shape == (3, 2)  # training items carry their jitter ...
    evals = [make(data, train=False)[i] for i in range(3)]
    assert collate(evals, tok.pad_id).jitter is None  # ... evaluation items none


def test_training_batches_keep_the_images_and_jitter(data):
    """collate(task_weights=...) stacks the images and the jitter as evaluation's collate does, with rows
    packed (one padding row when no item has a row); it has no task groups."""
    _, _, tok = data
    items = [make(data)[i] for i in range(3)]
    for keep_rows in (True, False):
        its = items if keep_rows else [{**it, "rows": []} for it in items]
        b = collate(its, tok.pad_id, pad_multiple=4, task_weights=WEIGHTS)
        assert torch.equal(b.images, torch.stack([it["image"] for it in items]))
        assert torch.equal(b.jitter, torch.stack([it["jitter"] for it in items])) and b.jitter.shape == (3, 2)
        assert b.groups == [] and (b.packed.real_tokens > 0) == keep_rows


def test_make_collate_passes_its_settings(data):
    _, _, tok = data
    items = [make(data)[i] for i in range(3)]
    fn = pickle.loads(pickle.dumps(make_collate(tok.pad_id, pad_multiple=4, task_weights=WEIGHTS)))  # workers
    got = fn(items).packed
    want = collate(items, tok.pad_id, pad_multiple=4, task_weights=WEIGHTS).packed
    assert torch.equal(got.input_ids, want.input_ids) and got.input_ids.shape[1] % 4 == 0
    assert torch.equal(got.target_weight, want.target_weight)
    for a, b in zip(make_collate(tok.pad_id)(items).groups, collate(items, tok.pad_id).groups, strict=True):
        _same_group(a, b)
    assert make_collate(tok.pad_id).keywords == dict(pad_id=tok.pad_id, pad_multiple=1, task_weights=None)


def test_collate_edge_cases(data, monkeypatch):
    _, _, tok = data
    ds = make(data)
    items = [ds[i] for i in range(3)]
    empty = collate([], tok.pad_id)
    assert empty.images.shape == (0,) and empty.groups == [] and empty.jitter is None
    assert collate(items[:1], tok.pad_id).jitter.shape == (1, 2)  # one item: its jitter still travels
    p = collate(items, tok.pad_id, pad_multiple=2, task_weights=WEIGHTS).packed  # 2 pads too
    assert p.input_ids.shape[1] % 2 == 0 and p.target_pos.numel() % 2 == 0 and p.image_tokens.shape[1] % 2 == 0
    # an evaluation batch (no jitter) pins too
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: t.clone())
    evals = collate([make(data, train=False)[i] for i in range(2)], tok.pad_id)
    assert evals.pin_memory().jitter is None


def test_pack_pads_nothing_by_default():
    """Without a pad_multiple (eager training) there are exactly the real targets and each image's tokens."""
    its = items(tiny_model(), seed=3, n_images=5)
    p = pack(its, 0, WEIGHTS)
    assert p.target_pos.numel() == sum(sum(r["loss_mask"]) for it in its for r in it["rows"])
    assert p.image_tokens.shape[1] == max(sum(len(r["input_ids"]) for r in it["rows"]) for it in its)
    c = collate(its, pad_id=0, task_weights=WEIGHTS).packed
    assert c.target_pos.numel() == p.target_pos.numel() and c.image_tokens.shape == p.image_tokens.shape
    assert plan([[3]]) == (3, [[(0, 0)]])  # a multiple of 2 would make it 4
