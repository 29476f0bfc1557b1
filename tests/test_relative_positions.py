"""Rotary positions: `dec_rope` (1-D, in the decoder's self-attention) and `dec_cross_rope` (2-D, in its
cross-attention: keys by patch, queries by a point each head computes; with `dec_cross_rope_follow` that point
starts at the centroid of the same head's attention one layer below). Scores depend on offsets; cached
decoding, padded batches, causality and the weights path keep their guarantees; old configs load; the decoder
step still exports."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_causal, lively_model, random_images, tiny_model
from test_generate import EOS, PROMPTS, ref_beam, ref_greedy

from vqa.config import ModelConfig
from vqa.decoding.generate import generate
from vqa.errors import ConfigError
from vqa.model import VQAModel
from vqa.model.attention import Attention, apply_rotary, rotary_table, rotate_2d

FLAGS = [dict(dec_rope=True), dict(dec_cross_rope=True), dict(dec_cross_rope=True, dec_cross_rope_follow=True),
         dict(dec_cross_coords=True),
         dict(dec_rope=True, dec_cross_rope=True, dec_cross_rope_follow=True, dec_cross_coords=True, dec_qk_norm=True)]


def _with_points(model: VQAModel, std: float = 0.3) -> VQAModel:
    """Give every cross-attention head a query point that moves with the text (they start at zero)."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for blk in model.decoder.blocks:
            if blk.cross_attn.rope2d:
                blk.cross_attn.q_point.copy_(torch.randn(blk.cross_attn.q_point.shape, generator=g) * std)
    return model


def test_rotary_scores_depend_only_on_the_offset():
    cos, sin = rotary_table(32, 8)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(8, generator=g), torch.randn(8, generator=g)

    def score(m: int, n: int) -> float:
        return float(apply_rotary(q, cos[m], sin[m]) @ apply_rotary(k, cos[n], sin[n]))

    for m, n, shift in ((3, 1, 5), (10, 0, 7), (2, 9, 20)):
        assert score(m, n) == pytest.approx(score(m + shift, n + shift), abs=1e-5)
    assert abs(score(3, 1) - score(3, 2)) > 1e-3  # and the offset does matter


def test_cross_rope_scores_depend_on_the_keys_offset_from_the_query_point_and_content_matches_anywhere():
    attn = Attention(32, 4, cross=True, grid=4, rope2d=True)  # head width 8: one frequency per axis, 4 kept
    freq = attn.rope_freq
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(8, generator=g), torch.randn(8, generator=g)

    def score(point: tuple[float, float], patch: int, qv=q, kv=k) -> float:
        qr = rotate_2d(qv, point[0] * freq, point[1] * freq)
        kr = rotate_2d(kv, attn.key_angles_x[patch], attn.key_angles_y[patch])
        return float(qr @ kr)

    # patch = row * 4 + col; columns and rows are counted from the centre (-1.5 .. 1.5)
    assert score((0.0, 0.0), 0) == pytest.approx(score((1.0, 0.0), 1), abs=1e-5)  # one column right, both
    assert score((0.5, -0.5), 5) == pytest.approx(score((1.5, 1.5), 4 * 3 + 2), abs=1e-5)  # (+1, +2)
    assert abs(score((0.0, 0.0), 0) - score((0.0, 0.0), 3)) > 1e-3
    content_q, content_k = q.clone(), k.clone()
    content_q[:4], content_k[:4] = 0, 0  # only the unrotated half: the same score at every patch and point
    scores = [score(p, n, content_q, content_k) for p in ((0.0, 0.0), (1.3, -0.7)) for n in range(16)]
    assert max(scores) - min(scores) < 1e-5


@torch.no_grad()
def test_cross_rope_query_points_start_at_the_centre_and_stay_on_the_grid():
    attn = Attention(32, 4, cross=True, grid=4, rope2d=True)
    x = torch.randn(2, 5, 32)
    ax, ay = attn.query_angles(x)
    assert ax.shape == (2, 4, 5, 1) and torch.count_nonzero(ax) == 0 and torch.count_nonzero(ay) == 0
    attn.q_point.normal_(0, 10.0)
    ax, _ = attn.query_angles(x)
    assert 0 < float(ax.abs().max()) <= 2.0 * float(attn.rope_freq.max()) + 1e-6  # at most half the grid away


@pytest.mark.parametrize("flags", FLAGS)
def test_weights_path_equals_sdpa_with_rotary_positions(flags):
    model = _with_points(lively_model(eos_id=EOS, **flags))
    images = random_images(2, model.cfg)
    ids = torch.tensor([[1, 5, 9, 13, 17], [1, 6, 10, 14, 18]])
    kv = model.memory_kv(model.encode(images))
    with torch.no_grad():
        plain, _ = model.decoder(ids, kv)
        weighted, maps = model.decoder(ids, kv, need_weights=True)
    torch.testing.assert_close(weighted, plain, atol=1e-5, rtol=1e-5)
    assert len(maps) == model.cfg.dec_depth


@pytest.mark.parametrize("flags", FLAGS)
def test_cached_generation_equals_uncached_with_rotary_positions(flags):
    model = _with_points(lively_model(eos_id=EOS, **flags))
    images = random_images(len(PROMPTS), model.cfg)
    out = generate(model, PROMPTS, images, max_new_tokens=10)
    beams = generate(model, PROMPTS, images, max_new_tokens=7, method="beam", num_beams=3)
    assert len({tuple(s) for s in out.sequences}) > 1
    for i, prompt in enumerate(PROMPTS):
        seq, score = ref_greedy(model, images[i : i + 1], prompt, 10)
        assert out.sequences[i] == seq and out.scores[i] == pytest.approx(score, abs=1e-4)
        ref = ref_beam(model, images[i : i + 1], prompt, 7, 3, 1.0)
        assert [s for s, _ in beams.beams[i]] == [s for s, _ in ref]


@pytest.mark.parametrize("flags", FLAGS)
def test_padded_batch_equals_prompts_one_by_one_with_rotary_positions(flags):
    """Left padding shifts a row's tokens, not its positions: the rotation follows the position ids."""
    model = _with_points(lively_model(eos_id=EOS, **flags))
    images = random_images(len(PROMPTS), model.cfg)
    batch = generate(model, PROMPTS, images, max_new_tokens=10)
    for i, prompt in enumerate(PROMPTS):
        alone = generate(model, [prompt], images[i : i + 1], max_new_tokens=10)
        assert batch.sequences[i] == alone.sequences[0]
        assert batch.scores[i] == pytest.approx(alone.scores[0], abs=1e-4)


@pytest.mark.parametrize("flags", FLAGS)
def test_rotary_decoder_is_still_causal(flags):
    assert_causal(_with_points(tiny_model(**flags)))


def test_the_flags_change_the_model_and_old_configs_load_without_them(tmp_path):
    plain = tiny_model()
    for flags in FLAGS:
        other = _with_points(tiny_model(**flags))
        same = tiny_model(dec_qk_norm=flags.get("dec_qk_norm", False))  # the model without the rotations
        missing, unexpected = other.load_state_dict(same.state_dict(), strict=False)
        assert unexpected == [] and all(m.endswith(("q_point", "coord_proj.weight")) for m in missing)
        images = random_images(1, plain.cfg)
        ids = torch.tensor([[1, 5, 9, 13]])
        with torch.no_grad():
            assert (other(images, ids).logits - same(images, ids).logits).abs().max() > 1e-4
    plain.save_pretrained(tmp_path)
    cfg = (tmp_path / "config.json").read_text()
    assert '"dec_rope"' in cfg
    old = "\n".join(line for line in cfg.splitlines() if "dec_rope" not in line and "dec_cross_rope" not in line)
    (tmp_path / "config.json").write_text(old)
    again = VQAModel.from_pretrained(tmp_path)
    assert not again.cfg.dec_rope and not again.cfg.dec_cross_rope
    with pytest.raises(ConfigError, match="head width divisible by 8"):
        ModelConfig(**{**plain.cfg.to_dict(), "dec_heads": 8, "dec_cross_rope": True})
    with pytest.raises(ConfigError, match="even head width"):
        ModelConfig(**{**plain.cfg.to_dict(), "dec_width": 36, "dec_heads": 4, "dec_rope": True, "vit_memory_pos": False})


def test_the_decoder_step_exports_with_rotary_positions():
    """torch.export of the decode step (what the ONNX export traces): no data-dependent Python in forward."""
    from vqa.export.onnx import DecoderStepGraph, example_inputs

    model = _with_points(tiny_model(dec_rope=True, dec_cross_rope=True, dec_cross_rope_follow=True, dec_qk_norm=True))
    step = DecoderStepGraph(model).eval()
    inputs = example_inputs(model)
    program = torch.export.export(step, tuple(inputs.values()), strict=False)
    with torch.no_grad():
        for a, b in zip(program.module()(*inputs.values()), step(*inputs.values()), strict=True):
            torch.testing.assert_close(a, b)


@torch.no_grad()
def test_follow_passes_each_heads_attention_centroid_to_the_layer_above():
    """The centroid a layer returns is the attention-weighted mean of the patches' (x, y) (the CLS token counts
    as the centre), and the layer above starts its query points there."""
    model = _with_points(tiny_model(dec_cross_rope=True, dec_cross_rope_follow=True))
    images = random_images(2, model.cfg)
    ids = torch.tensor([[1, 5, 9, 13], [1, 6, 10, 14]])
    kv = model.memory_kv(model.encode(images))
    attn = model.decoder.blocks[0].cross_attn
    x = torch.randn(2, 4, model.cfg.dec_width)
    out, w, centroid = attn(x, kv=kv[0], need_weights=True)
    xy = torch.cat([torch.zeros(1, 2), attn.patch_xy])  # [1 + 16, 2]
    torch.testing.assert_close(centroid, w @ xy, atol=1e-5, rtol=1e-5)
    out2, _, centroid2 = attn(x, kv=kv[0])
    torch.testing.assert_close(out2, out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(centroid2, centroid, atol=1e-5, rtol=1e-5)
    # the layer above with the centroid as its start equals a layer whose learned point adds it by hand
    above = model.decoder.blocks[1].cross_attn
    ax, ay = above.query_angles(x, centroid)
    bx, by = above.query_angles(x)
    torch.testing.assert_close(ax - bx, centroid[..., :1] * above.rope_freq)
    torch.testing.assert_close(ay - by, centroid[..., 1:] * above.rope_freq)
    hidden, maps = model.decoder(ids, kv, need_weights=True)
    assert len(maps) == 2 and hidden.shape == (2, 4, model.cfg.dec_width)
    with pytest.raises(ConfigError, match="needs dec_cross_rope"):
        ModelConfig(**{**model.cfg.to_dict(), "dec_cross_rope": False})


@torch.no_grad()
def test_coords_add_each_heads_attention_centroid_through_its_own_map():
    """dec_cross_coords: the output is the plain head output plus coord_proj of every head's centroid (x, y),
    in half-grids, whatever the value projection keeps."""
    model = tiny_model(dec_cross_coords=True)
    attn = model.decoder.blocks[0].cross_attn
    kv = model.memory_kv(model.encode(random_images(2, model.cfg)))[0]
    assert kv[1].shape[-1] == attn.head_dim + 2
    x = torch.randn(2, 5, model.cfg.dec_width)
    out, w = attn(x, kv=kv, need_weights=True)
    xy = torch.cat([torch.zeros(1, 2), attn.patch_xy]) / 2  # CLS at the centre; grid 4: half a grid is 2 patches
    centroid = (w @ xy).transpose(1, 2).reshape(2, 5, -1)  # [B, T, 2H]
    saved = attn.coord_proj.weight.clone()
    attn.coord_proj.weight.zero_()
    plain, _ = attn(x, kv=kv)
    attn.coord_proj.weight.copy_(saved)
    torch.testing.assert_close(out - plain, centroid @ saved.t(), atol=1e-5, rtol=1e-5)
    assert float((out - plain).abs().max()) > 1e-3
