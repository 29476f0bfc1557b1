"""Rows packed across images (vqa.data.packing, training's default): a packed row holds segments of several
images, and the cross-attention core runs image-major (vqa.model.attention.ImageRoute). It computes exactly what
one image per row and the task groups compute, a token only ever sees its own image's patches, padding changes
nothing, and the image keys/values are never copied per row."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_model
from test_packing import Ops, items

from vqa.data.collate import collate
from vqa.data.packing import pack_across, plan_across
from vqa.model.attention import ImageRoute
from vqa.model.masks import segment_mask
from vqa.train.objective import Objective

LENGTHS = [[[5, 5], [5, 5]], [[3, 9, 2], [20], [4]], [[7] * 6, [7], [7, 7]], [[1], [], [30, 2, 2, 2]],
           [[13, 14, 12, 15, 16], [11] * 9, [18, 3], [12, 12, 12]]]


@pytest.mark.parametrize("multiple", [1, 8])
@pytest.mark.parametrize("lengths", LENGTHS)
def test_plan_across_puts_every_row_in_exactly_one_packed_row_within_the_length(lengths, multiple):
    t, plan = plan_across(lengths, multiple)
    assert t % multiple == 0 and t >= max(n for ls in lengths for n in ls)
    placed = sorted(seg for row in plan for seg in row)
    assert placed == [(m, j) for m, ls in enumerate(lengths) for j in range(len(ls))]
    assert all(sum(lengths[m][j] for m, j in row) <= t for row in plan)
    assert all(row for row in plan)  # no empty packed row


def test_plan_across_mixes_images_to_pad_less_than_one_image_per_row():
    """Two images of 5 + 5 and one of 6: one image per row needs 3 rows; across images, 2 rows of 8."""
    t, plan = plan_across([[5, 3], [5, 3], [6, 2]])
    assert (t, len(plan)) == (8, 3)  # 24 tokens for 24: no padding at all
    assert any(len({m for m, _ in row}) > 1 for row in plan)


def image_of_tokens(p) -> torch.Tensor:
    """[R, T]: the image each packed token attends to (-1 on padding), read back from image_tokens."""
    out = torch.full((p.input_ids.numel(),), -1)
    width = p.image_tokens.shape[1]
    for m in range(p.image_tokens.shape[0]):
        slots = torch.arange(m * width, (m + 1) * width)
        real = (p.token_slots[p.image_tokens[m]] == slots) & (p.segments.view(-1)[p.image_tokens[m]] > 0)
        out[p.image_tokens[m][real]] = m
    return out.view_as(p.input_ids)


@pytest.mark.parametrize("seed,multiple", [(0, 1), (4, 8), (9, 1)])
def test_packed_rows_hold_every_image_row_once_with_its_image(seed, multiple):
    model = tiny_model()
    its = items(model, seed=seed, n_images=7)
    p = collate(its, pad_id=0, pad_multiple=multiple, pack_rows=pack_across).packed
    assert p.image_index is None and p.input_ids.shape[1] % multiple == 0
    assert p.image_tokens.shape[0] == len(its) and p.image_tokens.shape[1] % multiple == 0
    owner = image_of_tokens(p)
    assert torch.equal(owner >= 0, p.segments > 0)  # every real token has exactly its image, padding none
    found = [[] for _ in its]
    for r in range(p.input_ids.shape[0]):
        for s in range(1, int(p.segments[r].max()) + 1):
            at = (p.segments[r] == s).nonzero().squeeze(1)
            assert at.tolist() == list(range(int(at[0]), int(at[0]) + len(at)))  # contiguous
            assert p.positions[r, at].tolist() == list(range(len(at)))  # positions from 0
            assert len(set(owner[r, at].tolist())) == 1  # one image per segment
            found[int(owner[r, at[0]])].append(p.input_ids[r, at].tolist())
    assert [sorted(f) for f in found] == [sorted(r["input_ids"] for r in item["rows"]) for item in its]
    groups = collate(its, pad_id=0).groups
    assert p.task_targets == {g.task: g.n_targets for g in groups}
    k = sum(p.task_targets.values())
    assert torch.equal(p.input_ids[:, 1:].reshape(-1)[p.target_pos[:k]], p.target_ids[:k])
    assert (p.target_ids[k:] == -100).all()


def loss_and_grads(model, images, rows, weights=(1.0, 0.3)):
    model.zero_grad()
    loss = Objective(model)(images, rows, list(weights))
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("multiple", [1, 8])
def test_loss_and_gradients_equal_one_image_per_row_and_the_task_groups(multiple):
    """Same batch, three layouts, float64 (the loss summed in float32): the weighted loss sum agrees to 1e-6,
    every gradient to 1e-10."""
    model = tiny_model().double()
    its = items(model, seed=1, n_images=6)
    for it in its:
        it["image"] = it["image"].double()
    grouped = collate(its, pad_id=0)
    per_image = collate(its, pad_id=0, pad_multiple=multiple, pack_rows=True)
    across = collate(its, pad_id=0, pad_multiple=multiple, pack_rows=pack_across)
    assert across.packed.input_ids.shape[0] < per_image.packed.input_ids.shape[0]  # rows really mix images
    ref_loss, ref = loss_and_grads(model, grouped.images, grouped.groups)
    for rows in (per_image.packed, across.packed):
        loss, grads = loss_and_grads(model, grouped.images, rows)
        assert float(loss) == pytest.approx(float(ref_loss), rel=1e-6)  # the loss sums in float32
        assert grads.keys() == ref.keys()
        for n in ref:
            torch.testing.assert_close(grads[n], ref[n], atol=1e-10, rtol=1e-8, msg=n)


def hidden_across(model, images, p) -> torch.Tensor:
    """The decoder's hidden states [R, T, D] for packed rows across images."""
    kv = model.decoder.memory_kv(model.encode(images))
    hidden, _ = model.decoder(p.input_ids, kv, pos=p.positions, mask=segment_mask(p.segments),
                              route=ImageRoute(p.image_tokens, p.token_slots))
    return hidden


@pytest.mark.parametrize("j", [0, 2, 4])
def test_a_segment_never_sees_another_images_patches(j):
    """Perturb image j: exactly the tokens of image j change, wherever their rows are; every other token,
    image j's row neighbours included, computes the same to the last bit of float64 rounding."""
    model = tiny_model().double().eval()
    its = items(model, seed=11, n_images=5)
    images = torch.stack([it["image"] for it in its]).double()
    p = collate(its, pad_id=0, pack_rows=pack_across).packed
    owner = image_of_tokens(p)
    assert any(len(set(row[row >= 0].tolist())) > 1 for row in owner)  # some row mixes images
    with torch.no_grad():
        before = hidden_across(model, images, p)
        images[j] += torch.randn_like(images[j])
        after = hidden_across(model, images, p)
    change = (after - before).abs().amax(-1)  # [R, T]
    assert (change[owner == j] > 1e-6).all()
    assert change[(owner >= 0) & (owner != j)].max() < 1e-12


def test_padding_rows_tokens_and_queries_change_nothing():
    """Padding token ids, the padding queries of the image-major layout, padding to multiples of 8 and an
    image without text: the loss and the gradients stay the same."""
    model = tiny_model().double()
    its = items(model, seed=5, n_images=5)
    for it in its:
        it["image"] = it["image"].double()
    its[3]["rows"] = []  # an image without text: it has only padding queries
    images = torch.stack([it["image"] for it in its])
    plain = collate(its, pad_id=0, pack_rows=pack_across).packed
    ref_loss, ref = loss_and_grads(model, images, plain)
    padded = collate(its, pad_id=7, pad_multiple=8, pack_rows=pack_across).packed
    assert padded.input_ids.numel() > plain.input_ids.numel() and padded.image_tokens.shape[1] % 8 == 0
    # padding queries (image 3's, and past each image's tokens) point at arbitrary tokens
    g = torch.Generator().manual_seed(0)
    used = torch.zeros_like(padded.image_tokens, dtype=torch.bool).view(-1)
    used[padded.token_slots[padded.segments.view(-1) > 0]] = True
    noise = torch.randint(0, padded.input_ids.numel(), padded.image_tokens.shape, generator=g)
    padded.image_tokens = torch.where(used.view_as(noise), padded.image_tokens, noise)
    loss, grads = loss_and_grads(model, images, padded)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-6)  # the loss sums in float32
    for n in ref:
        torch.testing.assert_close(grads[n], ref[n], atol=1e-12, rtol=1e-10, msg=n)


class Shapes(Ops):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.startswith(("index_select", "gather", "expand", "repeat", "index", "cat")):
            self.names.append((func.__name__, tuple(args[0].shape) if torch.is_tensor(args[0]) else None))
        return func(*args, **(kwargs or {}))


def test_image_keys_and_values_are_never_copied_per_row():
    """The only gathers are of packed tokens (2-D): the queries into the image-major layout and the outputs
    back, once a layer each, and the LM head's target rows. Nothing indexes or expands the [M, H, N, Dh] keys
    and values."""
    model = tiny_model()
    its = items(model, seed=7, n_images=6)
    b = collate(its, pad_id=0, pack_rows=pack_across)
    with torch.no_grad(), Shapes() as ops:
        Objective(model)(b.images, b.packed, [1.0, 1.0])
    selects = [shape for name, shape in ops.names if name.startswith("index_select")]
    assert len(selects) == 2 * model.cfg.dec_depth + 1
    assert all(len(shape) == 2 for shape in selects)
    assert not [n for n in ops.names if not n[0].startswith("index_select") and n[1] and len(n[1]) == 4]
