"""Training's layout (vqa.data.packing): every text row of a batch packed, longest first, into rows that mix
images; each row a causal segment with its own positions, each token attending to its own image's patches
through the image-major cross-attention core (vqa.model.attention.ImageRoute). The loss and gradients equal the
model's own teacher-forced loss row by row, a token never sees another image, padding changes nothing, and the
image keys/values are never copied per row. Where each row goes: test_packing_plan.py."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch
from helpers import random_images, tiny_model
from torch.utils._python_dispatch import TorchDispatchMode

from vqa.data.collate import collate, make_collate
from vqa.data.packing import pack
from vqa.model.attention import ImageRoute
from vqa.model.encoder_decoder import segment_mask
from vqa.model.packed import IGNORE

WEIGHTS = {"vqa": 1.0, "caption": 0.3}


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


def packed(its, pad_id: int = 0, multiple: int = 1, weights=None):
    return collate(its, pad_id=pad_id, pad_multiple=multiple, task_weights=weights or WEIGHTS).packed


def reference_loss(model, its, weights=None) -> torch.Tensor:
    """The model's own teacher-forced loss (`VQAModel.teacher_forced`), one text row and its image at a time:
    the sum over rows of the task's weight x the row's mean loss x its target count."""
    weights = weights or WEIGHTS
    total = 0.0
    for it in its:
        for r in it["rows"]:
            out = model.teacher_forced(it["image"][None], torch.tensor([r["input_ids"]]),
                                       loss_mask=torch.tensor([r["loss_mask"]]), return_logits=False)
            total = total + weights[r["task"]] * out.loss * out.n_targets
    return total


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


def test_segment_mask_is_built_on_the_segments_device():
    """The mask is made where the segments are (the meta device stands in for a GPU: a causal part left on
    the CPU cannot be combined with meta tensors)."""
    seg = torch.tensor([[1, 1, 2, 0], [1, 2, 2, 2]])
    m = segment_mask(seg.to("meta"))
    assert m.device.type == "meta" and m.shape == (2, 1, 4, 4) and m.dtype == torch.bool
    assert torch.equal(segment_mask(seg)[1, 0], torch.tensor([[1, 0, 0, 0], [0, 1, 0, 0], [0, 1, 1, 0],
                                                              [0, 1, 1, 1]], dtype=torch.bool))


# ---- the packed tensors ----
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
def test_packed_rows_hold_every_image_row_once_with_its_image_and_weights(seed, multiple):
    model = tiny_model()
    its = items(model, seed=seed, n_images=7)
    p = packed(its, multiple=multiple)
    assert p.input_ids.shape[1] % multiple == 0 and p.target_pos.numel() % multiple == 0
    assert p.image_tokens.shape[0] == len(its) and p.image_tokens.shape[1] % multiple == 0
    owner = image_of_tokens(p)
    assert torch.equal(owner >= 0, p.segments > 0)  # every real token has exactly its image, padding none
    assert not p.input_ids[p.segments == 0].any() and not p.positions[p.segments == 0].any()  # 0 on padding
    found = [[] for _ in its]
    for r in range(p.input_ids.shape[0]):
        for s in range(1, int(p.segments[r].max()) + 1):
            at = (p.segments[r] == s).nonzero().squeeze(1)
            assert at.tolist() == list(range(int(at[0]), int(at[0]) + len(at)))  # contiguous
            assert p.positions[r, at].tolist() == list(range(len(at)))  # positions from 0
            assert len(set(owner[r, at].tolist())) == 1  # one image per segment
            found[int(owner[r, at[0]])].append(p.input_ids[r, at].tolist())
    assert [sorted(f) for f in found] == [sorted(r["input_ids"] for r in item["rows"]) for item in its]
    # each target is the token after its flat position, weighted by its row's task
    per_task = {t: sum(sum(r["loss_mask"]) for it in its for r in it["rows"] if r["task"] == t) for t in WEIGHTS}
    k = sum(per_task.values())
    assert torch.equal(p.input_ids[:, 1:].reshape(-1)[p.target_pos[:k]], p.target_ids[:k])
    assert (p.target_ids[k:] == IGNORE).all() and not p.target_weight[k:].any()
    w = p.target_weight[:k]
    assert int((w == 1.0).sum()) == per_task["vqa"] and int((w == torch.tensor(0.3)).sum()) == per_task["caption"]
    assert p.weighted_targets == pytest.approx(per_task["vqa"] + 0.3 * per_task["caption"])
    assert p.real_tokens == sum(len(r["input_ids"]) for it in its for r in it["rows"])


def _loss_and_grads(model, images, rows):
    model.zero_grad()
    loss = model(images, rows)
    loss.backward()
    return loss.detach(), {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}


@pytest.mark.parametrize("multiple", [1, 8])
def test_loss_and_gradients_equal_the_models_own_teacher_forced_loss(multiple):
    """Same batch, float64: the packed loss (summed in float32) equals the teacher-forced loss of each row
    alone, weighted, to 1e-6, and every gradient to 1e-10."""
    model = tiny_model().double()
    its = items(model, seed=1, n_images=6)
    for it in its:
        it["image"] = it["image"].double()
    images = torch.stack([it["image"] for it in its])
    p = packed(its, multiple=multiple)
    assert p.input_ids.shape[0] < len(its)  # rows really mix images
    model.zero_grad()
    ref_loss = reference_loss(model, its)
    ref_loss.backward()
    ref_loss = ref_loss.detach()
    ref = {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}
    loss, grads = _loss_and_grads(model, images, p)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-6)
    assert grads.keys() == ref.keys()
    for n in ref:
        torch.testing.assert_close(grads[n], ref[n], atol=1e-10, rtol=1e-8, msg=n)


def test_the_forward_returns_on_request_the_target_logits_its_loss_is_made_of():
    """`model(images, rows, return_logits=True)`: (the same loss, the logits [K, V] at the target positions),
    and that loss is those logits' cross-entropy against the targets times their task weights, summed."""
    model = tiny_model().eval()
    b = collate(items(model, seed=3), pad_id=0, pad_multiple=8, task_weights=WEIGHTS)
    with torch.no_grad():
        loss = model(b.images, b.packed)
        again, logits = model(b.images, b.packed, return_logits=True)
    assert torch.equal(again, loss) and logits.shape == (b.packed.target_pos.numel(), model.cfg.vocab_size)
    real = b.packed.target_ids != IGNORE
    logp = logits[real].float().log_softmax(-1).gather(1, b.packed.target_ids[real, None])[:, 0]
    torch.testing.assert_close(-(logp * b.packed.target_weight[real]).sum(), loss)


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
    p = packed(its)
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
    plain = packed(its)
    ref_loss, ref = _loss_and_grads(model, images, plain)
    padded = packed(its, pad_id=7, multiple=8)
    assert padded.input_ids.numel() > plain.input_ids.numel() and padded.image_tokens.shape[1] % 8 == 0
    assert padded.target_pos.numel() > plain.target_pos.numel()
    # padding queries (image 3's, and past each image's tokens) point at arbitrary tokens
    g = torch.Generator().manual_seed(0)
    used = torch.zeros_like(padded.image_tokens, dtype=torch.bool).view(-1)
    used[padded.token_slots[padded.segments.view(-1) > 0]] = True
    noise = torch.randint(0, padded.input_ids.numel(), padded.image_tokens.shape, generator=g)
    padded.image_tokens = torch.where(used.view_as(noise), padded.image_tokens, noise)
    loss, grads = _loss_and_grads(model, images, padded)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-6)  # the loss sums in float32
    for n in ref:
        torch.testing.assert_close(grads[n], ref[n], atol=1e-12, rtol=1e-10, msg=n)


class Shapes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

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
    b = collate(its, pad_id=0, task_weights=WEIGHTS)
    with torch.no_grad(), Shapes() as ops:
        model(b.images, b.packed)
    selects = [shape for name, shape in ops.names if name.startswith("index_select")]
    assert len(selects) == 2 * model.cfg.dec_depth + 1
    assert all(len(shape) == 2 for shape in selects)
    assert not [n for n in ops.names if not n[0].startswith("index_select") and n[1] and len(n[1]) == 4]


# ---- batches without text, moving and pinning ----
def test_items_without_text_pack_one_padding_row_and_one_padding_target():
    """Every sample of a batch unusable: one padding row and one ignored target of weight 0, every tensor
    long (torch.tensor([]) alone would be float) but the weights, whatever the multiple."""
    image = torch.zeros(3, 8, 8, dtype=torch.uint8)
    for multiple in (1, 4):
        p = pack([dict(image=image, rows=[]), dict(image=image, rows=[])], 0, WEIGHTS, multiple)
        assert p.input_ids.shape == (1, max(multiple, 2)) and p.real_tokens == 0 and p.weighted_targets == 0.0
        assert p.target_pos.numel() == multiple and (p.target_ids == IGNORE).all()
        assert not p.target_weight.any() and p.target_weight.dtype == torch.float32
        assert p.image_tokens.shape[0] == 2 and p.token_slots.numel() == p.input_ids.numel()
        for name in ("input_ids", "positions", "segments", "target_pos", "target_ids", "image_tokens", "token_slots"):
            assert getattr(p, name).dtype == torch.long, name


def test_a_batch_without_any_text_row_gives_a_zero_loss_that_reaches_every_parameter():
    """A batch whose samples were all unusable still makes a step: zero loss, a zero gradient (not None) on
    every parameter, so backward() works and DDP's static graph holds."""
    model = tiny_model().train()
    images = random_images(2, model.cfg)
    batch = collate([dict(image=images[0], rows=[]), dict(image=images[1], rows=[])], pad_id=0,
                    task_weights=WEIGHTS)
    loss = model(batch.images, batch.packed)
    loss.backward()
    assert float(loss.detach()) == 0.0
    assert all(q.grad is not None and not q.grad.any() for q in model.parameters())


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


def _training_batch():
    its = items(tiny_model(), seed=3, n_images=3)
    its = [{**it, "jitter": torch.tensor([1.0, 1.0])} for it in its]
    return collate(its, pad_id=0, pad_multiple=4, task_weights=WEIGHTS)


def test_packed_rows_move_every_tensor_and_keep_the_rest(monkeypatch):
    """PackedRows.to: every tensor field goes to the device asked for, with the non_blocking asked for (the meta
    device stands in for a GPU: only the device changes); the weighted target count travels as it is."""
    p = _training_batch().packed
    tensors = {k for k, v in _fields(p).items() if torch.is_tensor(v)}
    assert tensors == {"input_ids", "positions", "segments", "target_pos", "target_ids", "target_weight",
                       "image_tokens", "token_slots"}
    moved = p.to("meta")
    for name, v in _fields(moved).items():
        if name in tensors:
            orig = getattr(p, name)
            assert v.device.type == "meta" and v.shape == orig.shape and v.dtype == orig.dtype, name
        else:
            assert v == getattr(p, name), name
    _same_packed(p.to("cpu"), p)
    calls, real_to = [], torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda t, *args, **kw: calls.append((args, kw.get("non_blocking")))
                        or real_to(t, *args, **kw))
    for asked in (True, False):
        calls.clear()
        p.to("cpu", non_blocking=asked)
        assert calls == [(("cpu",), asked)] * len(tensors)
    calls.clear()
    p.to("cpu")
    assert calls == [(("cpu",), False)] * len(tensors)  # blocking unless asked


def test_make_collate_packs_with_its_settings():
    its = items(tiny_model(), seed=2)
    fn = make_collate(0, pad_multiple=4, task_weights=WEIGHTS)
    got, want = fn(its), collate(its, 0, 4, WEIGHTS)
    assert got.groups == [] and got.packed.input_ids.shape[1] % 4 == 0
    _same_packed(got.packed, want.packed)
    assert make_collate(0).keywords["task_weights"] is None  # evaluation: task groups
    assert collate(its, 0).packed is None and len(collate(its, 0).groups) == 2


def test_packed_batch_pins_every_tensor(monkeypatch):
    """ImageTextBatch.pin_memory with packed rows: the images, the jitter and every packed tensor are pinned once each
    (pin_memory needs an accelerator: a stand-in records each tensor it was asked to pin, returns a copy)."""
    batch = _training_batch()
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

