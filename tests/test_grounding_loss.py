"""Training's grounding loss (`--grounding-weight`): which tokens of a Shapes or Scenes row name which object
(`vqa.data.regions`), their targets on the patch grid (moving with the picture's shift and flip), their place
in the packed rows, the loss against the attention the explain path shows, and that training with it moves the
cross-attention onto the named objects."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_set_flags
from helpers import tiny_model
from test_packing import WEIGHTS, items, packed, reference_loss

from vqa.cli import main
from vqa.data.collate import collate
from vqa.data.dataset import ImageTextDataset
from vqa.data.regions import Regions, box_cover
from vqa.data.sources import open_split
from vqa.data.synthetic.scene_objects import ATTRIBUTE_FAMILIES
from vqa.data.transforms import ImageNormalizer, build_transform
from vqa.model.attention import ImageRoute
from vqa.model.encoder_decoder import grounding_loss, segment_mask
from vqa.tokenizer import Tokenizer
from vqa.weights import model_files, shipped


@pytest.fixture(scope="module")
def towers():
    model, tok, _ = shipped.load("tiny")
    return model.cfg, tok


def dataset(folder, towers, train=True):
    cfg, tok = towers
    ds = ImageTextDataset(open_split(folder, "train"), tok, build_transform(cfg, train=train), cfg.dec_max_len,
                          questions_per_image=6, captions_per_image=2, train=True)
    ds.maker.regions = Regions.of(folder, "train", tok, cfg.vit_image_size, cfg.grid)
    return ds


def test_box_cover_weighs_each_patch_by_the_share_the_box_covers():
    t = box_cover([(1.0, 2.0, 2.5, 3.0)], 4).reshape(4, 4)  # one whole patch (row 2, col 1), half of (2, 2)
    assert t[2, 1] == pytest.approx(2 / 3) and t[2, 2] == pytest.approx(1 / 3) and t.sum() == pytest.approx(1)
    union = box_cover([(0, 0, 1, 1), (0, 0, 2, 1)], 4).reshape(4, 4)  # overlapping boxes count once
    assert union[0, :2].tolist() == pytest.approx([0.5, 0.5])
    assert box_cover([(5, 5, 6, 6)], 4) is None  # moved off the grid


@pytest.mark.parametrize("which", ["shapes", "scenes"])
def test_named_objects_and_attribute_answers_are_grounded_on_their_boxes(which, shapes_dir, scenes_dir, towers):
    folder = shapes_dir if which == "shapes" else scenes_dir
    ds = dataset(folder, towers, train=False)  # no shift, no flip: the targets are the boxes themselves
    cfg, tok = towers
    regions, seen = ds.maker.regions, {"mention": 0, "answer": 0}
    kinds = regions.scenes.set.kinds
    for i in range(len(ds)):
        for row in ds[i]["rows"]:
            objs = regions.scenes.scenes[row["meta"]["image_id"]]["objects"]
            boxes = [box_cover([tuple(v * cfg.grid / regions.scenes.side for v in o["box"])], cfg.grid)
                     for o in objs]
            answers = set(range(row["prompt_len"] - 1, len(row["input_ids"]) - 1)) if row["task"] == "vqa" else set()
            for at, target in zip(*row.get("regions", ([], [])), strict=True):
                assert target.sum() == pytest.approx(1, abs=1e-5)
                if at in answers:  # an attribute or count answer
                    seen["answer"] += 1
                    assert row["meta"]["question_type"] in (*ATTRIBUTE_FAMILIES, "count")
                    continue
                seen["mention"] += 1  # the last token of a phrase naming one object: its kind's last piece ...
                piece = tok.decode([row["input_ids"][at]]).strip()
                assert any(k.endswith(piece) or (k + "s").endswith(piece) for k in kinds), piece
                assert any(np.allclose(target, b) for b in boxes)  # ... and exactly one object's box
            meta = row["meta"]
            if meta.get("question_type") in ATTRIBUTE_FAMILIES:  # every answer query, on the generator's referent
                i = regions.scenes.referent(meta["image_id"], meta["question_type"], meta["question"],
                                            meta["answers"][0])
                where, targets = row["regions"]
                assert answers <= set(where)
                assert all(np.allclose(t, boxes[i]) for at, t in zip(where, targets, strict=True) if at in answers)
    assert seen["mention"] >= 10 and seen["answer"] >= 4, seen


def test_the_targets_move_with_the_picture(scenes_dir, towers):
    cfg, _ = towers
    regions = dataset(scenes_dir, towers).maker.regions
    image_id, scene = next(iter(regions.scenes.scenes.items()))
    box = scene["objects"][0]["box"]
    still = regions._targets([box], (0, 0, False)).reshape(cfg.grid, cfg.grid)
    flipped = regions._targets([box], (0, 0, True)).reshape(cfg.grid, cfg.grid)
    np.testing.assert_allclose(flipped, still[:, ::-1], atol=1e-6)
    patch = cfg.vit_image_size // cfg.grid
    down = regions._targets([box], (0, patch, False)).reshape(cfg.grid, cfg.grid)
    if still[-1].sum() == 0:  # a whole patch down: one grid row down
        np.testing.assert_allclose(down[1:], still[:-1], atol=1e-6)


def test_packed_grounded_tokens_are_the_rows_tokens_on_their_own_image(shapes_dir, towers):
    ds = dataset(shapes_dir, towers)
    its = [ds[i] for i in range(5)]
    rows = collate(its, pad_id=0, pad_multiple=8, task_weights={**WEIGHTS, "grounding": 0.7}).packed
    flat = rows.input_ids.view(-1)
    # image m's row: its grounded tokens, in the packed rows, are those of its own text rows, with their targets
    for m, it in enumerate(its):
        want = sorted((row["input_ids"][at], tuple(t.tolist())) for row in it["rows"] if "regions" in row
                      for at, t in zip(*row["regions"], strict=True))
        real = rows.ground_weight[m] > 0
        got = sorted((int(flat[p]), tuple(t.tolist()))
                     for p, t in zip(rows.ground_tokens[m][real], rows.ground_target[m][real], strict=True))
        assert got == want and len(want) > 0
        # each is a token of image m: the route sends its query to image m's keys
        assert (rows.token_slots[rows.ground_tokens[m][real]] // rows.image_tokens.shape[1] == m).all()
    assert rows.ground_tokens.shape[1] % 8 == 0 and rows.ground_weight.unique().tolist() == pytest.approx([0, 0.7])
    assert rows.ground_target[rows.ground_weight == 0].eq(0).all()  # padding: no target
    assert collate(its, pad_id=0, task_weights=WEIGHTS).packed.ground_tokens is None  # off: nothing built


def test_grounding_loss_is_the_kl_of_the_target_from_the_mean_attention():
    # 2 layers, 1 image, 3 heads, 2 grounded tokens, 1 prefix key + 4 patches
    maps = [torch.softmax(torch.randn(1, 3, 2, 5), -1) for _ in range(2)]
    target = torch.tensor([[[0.5, 0.5, 0, 0], [0, 0, 0, 1.0]]])
    mean = torch.stack(maps).mean((0, 2))[0, :, 1:]  # [2 tokens, 4 patches]
    want = [sum(t * np.log(t / a) for t, a in zip(tr.tolist(), ar.tolist(), strict=True) if t > 0)
            for tr, ar in zip(target[0], mean, strict=True)]
    assert grounding_loss(maps, target)[0].tolist() == pytest.approx(want, rel=1e-5)
    exact = torch.tensor([0.0, 0.25, 0.25, 0.25, 0.25]).expand(1, 3, 1, 5)
    assert grounding_loss([exact], torch.full((1, 1, 4), 0.25)).item() == pytest.approx(0, abs=1e-6)
    assert grounding_loss([exact], torch.zeros(1, 1, 4)).item() == 0  # a padding target


def test_packed_grounding_loss_equals_the_explain_paths_attention_row_by_row():
    """The probe reads, for each grounded token of the packed rows, the cross-attention that a teacher-forced
    pass of its row alone shows (`need_weights`), so the packed loss is the row-by-row reference plus the KL
    of each grounded token's target from those maps."""
    torch.manual_seed(0)
    model = tiny_model().eval()
    its = items(model, seed=3)
    g = torch.Generator().manual_seed(1)
    cells = model.cfg.grid ** 2
    want = reference_loss(model, its)
    for it in its:
        for r in it["rows"]:
            where = sorted(torch.randperm(len(r["input_ids"]), generator=g)[:2].tolist())
            goal = torch.rand(len(where), cells, generator=g)
            r["regions"] = (where, (goal / goal.sum(1, keepdim=True)).numpy())
            kv = model.memory_kv(model.encode(it["image"][None]))
            _, maps = model.decoder(torch.tensor([r["input_ids"]]), kv, need_weights=True)
            at = [m[:, :, where] for m in maps]  # per layer [1, H, G, N]: one image, its G grounded tokens
            want = want + 0.5 * grounding_loss(at, torch.as_tensor(r["regions"][1])[None]).sum()
    rows = packed(its, weights={**WEIGHTS, "grounding": 0.5})
    with torch.no_grad():
        got = model(torch.stack([it["image"] for it in its]), rows)
    assert got.item() == pytest.approx(want.item(), rel=1e-4)


def inside_mass(model, tok, folder) -> float:
    """The mean share of the attention (every layer's and head's mean, `grounding_loss`'s map) behind the
    grounded tokens of `folder`'s first training pictures that falls on their objects' patches."""
    ds = dataset(folder, (model.cfg, tok), train=False)
    its = [ds[i] for i in range(12)]
    rows = collate(its, pad_id=tok.pad_id, task_weights={**WEIGHTS, "grounding": 1.0}).packed
    images = ImageNormalizer(model.cfg.vit_mean, model.cfg.vit_std)(torch.stack([it["image"] for it in its]))
    with torch.no_grad():
        _, maps = model.decoder(rows.input_ids, model.decoder.memory_kv(model.encode(images)), pos=rows.positions,
                                mask=segment_mask(rows.segments), route=ImageRoute(rows.image_tokens, rows.token_slots),
                                probe=rows.ground_tokens)
    attn = torch.stack(maps).mean((0, 2))[..., -rows.ground_target.shape[-1]:]  # [M, Lg, patches]
    inside = (attn * (rows.ground_target > 0)).sum(-1)
    return float(inside[rows.ground_weight > 0].mean())


def test_training_with_grounding_moves_the_attention_onto_the_objects(shapes_dir, tmp_path):
    """The same 60 steps of a small model from random weights, with and without the grounding loss: with it,
    the attention behind the grounded tokens holds much more of its mass on their objects."""
    common = ["train", "--data", str(shapes_dir), "--max-steps", "60", "--batch-size", "8", "--eval-images", "0",
              "--lr", "3e-3", "--seed", "0", *tiny_set_flags()]
    mass = {}
    for weight in (0, 2):
        run = tmp_path / f"w{weight}"
        assert main([*common, "--out", str(run), "--grounding-weight", str(weight)]) == 0
        mass[weight] = inside_mass(model_files.load(run / "last"), Tokenizer.load(run / "last"), shapes_dir)
    assert mass[2] > mass[0] + 0.15, mass
