"""collate (vqa/data/collate.py): rows grouped by task with their precomputed targets, padding that keeps
every target and adds none, batches that move and pin every tensor and find their groups, packed batches,
make_collate's settings and the edge cases. The datasets come from data_fixtures.make, the `data` fixture from
conftest.py."""

from __future__ import annotations

import pickle

import torch
from data_fixtures import make

from vqa.data.collate import IGNORE, collate, make_collate


def _expected_targets(rows) -> list[tuple[int, int, int]]:
    """The reference, from the rows alone: (row b, position p, token) for each target token, where the token
    is row b's token p+1 and the loss mask is set on it (the logits at p predict the token after p)."""
    return [(b, p, r["input_ids"][p + 1]) for b, r in enumerate(rows)
            for p in range(len(r["input_ids"]) - 1) if r["loss_mask"][p + 1]]


def _targets(g) -> list[tuple[int, int, int]]:
    """A TaskGroup's real targets as (row, position, token), from its flat positions in [B, T-1]."""
    width = g.input_ids.shape[1] - 1
    real = g.target_ids != IGNORE
    return [(int(p) // width, int(p) % width, int(t)) for p, t in zip(g.target_pos[real], g.target_ids[real],
                                                                      strict=True)]


def test_collate_groups_rows_by_task_with_their_targets(data):
    _, _, tok = data
    ds = make(data, train=False)
    items = [ds[i] for i in range(3)]
    batch = collate(items, tok.pad_id)
    assert batch.images.shape == (3, 3, 64, 64)
    assert [g.task for g in batch.groups] == ["vqa", "caption"]  # in order of first appearance
    for g in batch.groups:
        rows = [(k, r) for k, it in enumerate(items) for r in it["rows"] if r["task"] == g.task]
        t = max(len(r["input_ids"]) for _, r in rows)  # each group is cut to its own longest row
        assert g.input_ids.shape == g.attention_mask.shape == g.loss_mask.shape == (len(rows), t)
        assert g.rows == len(rows) and g.meta == [r["meta"] for _, r in rows]
        assert g.prompts() == [r["input_ids"][: r["prompt_len"]] for _, r in rows]
        for b, (k, row) in enumerate(rows):
            n = len(row["input_ids"])
            assert g.image_index[b] == k and torch.equal(batch.images[k], items[k]["image"])
            assert g.input_ids[b, :n].tolist() == row["input_ids"]
            assert (g.input_ids[b, n:] == tok.pad_id).all() and not g.attention_mask[b, n:].any()
            assert g.attention_mask[b, :n].all()
            assert g.loss_mask[b].tolist()[:n] == row["loss_mask"]
        # the targets, precomputed on the CPU: position p of [B, T-1] predicts token p+1 of its row
        assert g.n_targets > 0 and _targets(g) == _expected_targets([r for _, r in rows])
        assert g.n_targets == sum(sum(r["loss_mask"][1:]) for _, r in rows)
    fn = pickle.loads(pickle.dumps(make_collate(tok.pad_id)))
    assert torch.equal(fn(items).groups[0].input_ids, batch.groups[0].input_ids)


def test_padded_collate_keeps_every_target_and_adds_none(data):
    _, _, tok = data
    ds = make(data)
    items = [ds[i] for i in range(3)]
    plain, padded = collate(items, tok.pad_id), collate(items, tok.pad_id, pad_multiple=8)
    for a, b in zip(plain.groups, padded.groups, strict=True):
        assert b.input_ids.shape[0] % 8 == 0 and b.input_ids.shape[1] % 8 == 0 and b.target_pos.numel() % 8 == 0
        assert b.n_targets == a.n_targets and b.rows == a.rows
        real = b.target_ids != IGNORE
        assert int(real.sum()) == a.n_targets
        # the (row, position, token) triples of the rows themselves; padding rows attend to nothing and
        # predict nothing
        rows = [r for it in items for r in it["rows"] if r["task"] == a.task]
        assert _targets(a) == _targets(b) == _expected_targets(rows)
        assert not b.attention_mask[b.rows :].any() and not b.loss_mask[b.rows :].any()
        # padding rows read image 0 and have no prompt; every per-row tensor has one entry per padded row
        assert b.image_index.shape == b.prompt_len.shape == (b.input_ids.shape[0],)
        assert not b.image_index[b.rows :].any() and not b.prompt_len[b.rows :].any()


def _same_group(a, b):
    """Every field of two TaskGroups equal (tensors by value and dtype)."""
    from dataclasses import fields

    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if torch.is_tensor(x):
            assert torch.is_tensor(y) and x.dtype == y.dtype and torch.equal(x, y), f.name
        else:
            assert x == y, f.name


def test_batches_move_and_pin_every_tensor_and_find_their_groups(data, monkeypatch):
    _, _, tok = data
    ds = make(data)
    items = [ds[i] for i in range(3)]
    batch = collate(items, tok.pad_id, pad_multiple=4)
    g = batch.group("vqa")
    assert g is batch.groups[0] and batch.group("caption") is batch.groups[1] and batch.group("none") is None
    _same_group(g.to("cpu", non_blocking=True), g)
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
        b = collate(its, tok.pad_id, pad_multiple=4, task_weights={"vqa": 1.0, "caption": 0.5})
        assert torch.equal(b.images, torch.stack([it["image"] for it in items]))
        assert torch.equal(b.jitter, torch.stack([it["jitter"] for it in items])) and b.jitter.shape == (3, 2)
        assert b.groups == [] and (b.packed.real_tokens > 0) == keep_rows


def test_make_collate_passes_its_settings(data):
    _, _, tok = data
    items = [make(data)[i] for i in range(3)]
    fn = make_collate(tok.pad_id, pad_multiple=4)
    want = collate(items, tok.pad_id, pad_multiple=4)
    got = fn(items)
    for a, b in zip(got.groups, want.groups, strict=True):
        _same_group(a, b)
    assert all(g.input_ids.shape[1] % 4 == 0 and g.input_ids.shape[0] % 4 == 0 for g in got.groups)
    assert make_collate(tok.pad_id).keywords["pad_multiple"] == 1


def test_collate_edge_cases(data, monkeypatch):
    _, _, tok = data
    ds = make(data)
    items = [ds[i] for i in range(3)]
    empty = collate([], tok.pad_id)
    assert empty.images.shape == (0,) and empty.groups == [] and empty.jitter is None
    assert collate(items[:1], tok.pad_id).jitter.shape == (1, 2)  # one item: its jitter still travels
    for g in collate(items, tok.pad_id, pad_multiple=2).groups:  # 2 pads too
        assert g.input_ids.shape[0] % 2 == 0 and g.input_ids.shape[1] % 2 == 0 and g.target_pos.numel() % 2 == 0
    # padding targets are ignored: every target past the real ones is IGNORE
    g = collate(items, tok.pad_id, pad_multiple=8).group("vqa")
    assert g.target_pos.numel() > g.n_targets  # the test needs padding targets
    assert (g.target_ids[g.n_targets :] == IGNORE).all() and (g.target_ids[: g.n_targets] != IGNORE).all()
    # moved tensors really move (the meta device: no data, only the device changes)
    moved = g.to("meta")
    assert all(getattr(moved, f).device.type == "meta" for f in vars(g) if torch.is_tensor(getattr(g, f)))
    # an evaluation batch (no jitter) pins too
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: t.clone())
    evals = collate([make(data, train=False)[i] for i in range(2)], tok.pad_id)
    assert evals.pin_memory().jitter is None
