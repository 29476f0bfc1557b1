"""The attention explorer's numbers (vqa.inference.explain) against the model itself: the masked self-attention is
causal with rows summing to 1, the per-head cross-attention maps average to the demo's single map and equal
the maps answering returns, the raw scores are q.k / sqrt(d) of the module's own projections and the
weights mixed with its values give the fused fast path's output, the explain pass computes the same logits
as the fused fast path, the ViT's weights are read with its fused attention off and restored after, and the
export / CLI write what they say."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from predict_fixtures import COLOR_Q, draw, shared_checkpoint, write_pictures

from vqa.inference.explain import decoder_capture, explain_tokens, vit_capture


@pytest.fixture(scope="module")
def pred():
    from vqa.inference.predict import Predictor

    return Predictor.from_pretrained(shared_checkpoint(), device="cpu")


@pytest.fixture(scope="module")
def answer_and_explanation(pred):
    img = draw("red_circle")
    res = pred.answer(img, COLOR_Q, top_k=2, return_attention=True)
    return img, res, pred.explain(img, result=res)


def test_shapes_and_tokens(pred, answer_and_explanation):
    _, res, e = answer_and_explanation
    cfg = pred.cfg
    t = len(res.prompt_ids) + len(res.ids)
    assert e.tokens[: e.prompt_len][:2] == ["<bos>", "<question>"] and e.generated == ["red"]
    assert e.self_weights.shape == e.self_scores.shape == (cfg.dec_depth, cfg.dec_heads, t, t)
    n = e.memory_prefix + cfg.grid**2
    assert e.cross_weights.shape == e.cross_scores.shape == (cfg.dec_depth, cfg.dec_heads, t, n)
    nv = pred.model.vision.num_prefix + cfg.grid**2
    assert e.vit_weights.shape == (cfg.vit_depth, cfg.vit_heads, nv, nv)


def test_the_masked_self_attention_is_lower_triangular_and_its_rows_sum_to_1(answer_and_explanation):
    _, _, e = answer_and_explanation
    w, s = e.self_weights, e.self_scores
    t = w.shape[-1]
    upper = np.triu(np.ones((t, t), dtype=bool), 1)
    assert np.all(w[..., upper] == 0.0)
    assert np.all(np.isneginf(s[..., upper])) and np.all(np.isfinite(s[..., ~upper]))
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
    assert (w[..., ~upper] > 0).all()  # and every allowed key gets some weight: a real softmax, not a copy


def test_per_head_cross_attention_maps_average_to_the_demo_map_and_equal_the_answer_maps(answer_and_explanation):
    from vqa.inference.heatmaps import select_map

    _, res, e = answer_and_explanation
    maps = e.cross_maps()  # [G, L, H, grid, grid]
    np.testing.assert_allclose(maps, res.attention.numpy(), atol=1e-5)
    for g in range(maps.shape[0]):
        np.testing.assert_allclose(maps[g].mean((0, 1)), select_map(res.attention[g]), atol=1e-5)
        for layer in range(maps.shape[1]):  # and one layer's mean over heads is the demo's map for that layer
            np.testing.assert_allclose(maps[g, layer].mean(0), select_map(res.attention[g], layer=layer), atol=1e-5)


def test_the_raw_scores_are_q_dot_k_over_sqrt_d_and_the_weights_give_the_fast_paths_output(
        pred, answer_and_explanation):
    img, res, e = answer_and_explanation
    model = pred.model
    seen, outputs = {}, {}  # each cross-attention's text stream, image keys and values, output: on the fast path

    def catch(i):
        def hook(mod, args, kwargs):
            seen[i] = (args[0].detach(), *(t.detach() for t in kwargs["kv"]))
        return hook

    def catch_output(i):
        def hook(mod, args, kwargs, out):
            outputs[i] = out[0].detach()
        return hook

    handles = [blk.cross_attn.register_forward_pre_hook(catch(i), with_kwargs=True)
               for i, blk in enumerate(model.decoder.blocks)]
    handles += [blk.cross_attn.register_forward_hook(catch_output(i), with_kwargs=True)
                for i, blk in enumerate(model.decoder.blocks)]
    try:
        x = pred.transform(img)[None]
        with torch.no_grad():
            memory = model.encode(x)
            ids = torch.as_tensor([res.prompt_ids + res.ids])
            model.decoder(ids, model.memory_kv(memory))
    finally:
        for h in handles:
            h.remove()
    for i, blk in enumerate(model.decoder.blocks):
        att = blk.cross_attn
        text, k, v = seen[i]  # [1, T, D], [1, H, N, Dh] x 2
        b, t, d = text.shape
        q = att.q_norm(att.q(text).view(b, t, att.heads, att.head_dim).transpose(1, 2))
        by_hand = ((q @ k.transpose(-2, -1))[0] / math.sqrt(att.head_dim)).detach()  # [H, T, N]
        np.testing.assert_allclose(e.cross_scores[i], by_hand.numpy(), rtol=1e-4, atol=1e-4)
        # the weights are the ones the model attends with: mixing the fast path's values with them and
        # projecting gives the fast path's (fused kernel's) output
        # the output is proj(weights @ values) alone
        w = torch.from_numpy(e.cross_weights[i])[None]  # [1, H, T, N]
        with torch.no_grad():
            mixed = att.proj((w @ v).transpose(1, 2).reshape(b, t, d))
        torch.testing.assert_close(mixed, outputs[i], rtol=1e-4, atol=1e-5)
    soft = torch.from_numpy(e.self_scores).softmax(-1).numpy()
    np.testing.assert_allclose(soft, e.self_weights, atol=1e-6)
    s, w = e.query_against_keys(0, e.cross_weights.shape[0] - 1, 1)
    np.testing.assert_allclose(s, e.cross_scores[-1, 1, e.prompt_len - 1])
    np.testing.assert_allclose(np.exp(s - s.max()) / np.exp(s - s.max()).sum(), w, atol=1e-6)


def test_the_explain_pass_computes_what_the_fast_path_computes_and_leaves_it_fast(pred):
    model = pred.model
    x = pred.transform(draw("blue_square"))[None]
    ids = torch.as_tensor([pred.tokenizer.vqa_prompt(COLOR_Q) + [5, 6]])
    vit_attn = [m for m in model.vision.vit.modules() if hasattr(m, "fused_attn")]
    before = [m.fused_attn for m in vit_attn]
    with torch.no_grad():
        fast_memory = model.encode(x)
        fast, _ = model.decoder(ids, model.memory_kv(fast_memory))
        with vit_capture(model.vision.vit) as records:
            slow_memory = model.encode(x)
            assert all(m.fused_attn is False for m in vit_attn)
        with decoder_capture(model.decoder) as (selfs, crosses):
            slow, _ = model.decoder(ids, model.memory_kv(slow_memory))
    torch.testing.assert_close(slow_memory, fast_memory, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(slow, fast, rtol=1e-4, atol=1e-5)
    assert len(records) == pred.cfg.vit_depth
    assert all(len(s) == 1 and len(c) == 1 for s, c in zip(selfs, crosses, strict=True))
    for r in records:  # the ViT's softmax rows
        torch.testing.assert_close(r.sum(-1), torch.ones_like(r.sum(-1)))
    # everything is switched back: fused attention in the ViT, no capture lists in the decoder
    assert [m.fused_attn for m in vit_attn] == before
    assert all(blk.self_attn.capture is None and blk.cross_attn.capture is None for blk in model.decoder.blocks)


def test_a_patch_can_be_followed_into_the_vit(pred, answer_and_explanation):
    _, _, e = answer_and_explanation
    g, p = e.grid, e.vit_prefix
    maps = e.vit_patch_attention(1, 2)  # [Lv, Hv, grid, grid]
    q = p + 1 * g + 2
    np.testing.assert_allclose(maps.reshape(*maps.shape[:2], -1), e.vit_weights[:, :, q, p:])
    assert not np.allclose(maps, e.vit_patch_attention(3, 0))
    with pytest.raises(Exception, match="outside"):
        e.vit_patch_attention(g, 0)


def test_explain_without_a_result_answers_or_captions_first(pred):
    img = draw("blue_square")
    e = pred.explain(img, COLOR_Q)
    assert e.text == "blue" and e.question == COLOR_Q
    c = pred.explain(img)
    assert c.text == "a blue square" and c.generated == ["a", "blue", "square"] and c.question is None
    direct = explain_tokens(pred.model, pred.transform(img)[None], pred.tokenizer.caption_prompt(),
                            pred.caption(img).ids)
    np.testing.assert_allclose(direct["cross_weights"], c.cross_weights)


def test_save_writes_every_array_and_the_pictures(answer_and_explanation, tmp_path):
    from PIL import Image

    _, _, e = answer_and_explanation
    files = e.save(tmp_path / "out")
    names = {f.name for f in files}
    layers = e.self_weights.shape[0]
    assert {"attention.npz", *(f"self_attention_layer{i + 1}.png" for i in range(layers))} <= names
    assert any(n.startswith("cross_attention_01_red") for n in names)
    assert any(n.startswith("query_keys_01_red") for n in names) and any(n.startswith("vit_attention") for n in names)
    with np.load(tmp_path / "out" / "attention.npz") as z:
        np.testing.assert_array_equal(z["self_weights"], e.self_weights)
        np.testing.assert_array_equal(z["cross_scores"], e.cross_scores)
        np.testing.assert_array_equal(z["cross_maps"], e.cross_maps())
        assert list(z["tokens"]) == e.tokens and int(z["prompt_len"]) == e.prompt_len
    for f in files:
        if f.suffix == ".png":
            with Image.open(f) as im:
                assert im.width > 200 and im.height > 100


def test_vqa_ask_attention_out_writes_the_same_arrays(pred, tmp_path, capsys):
    from vqa.cli import main

    pic = write_pictures(tmp_path)["red_circle"]
    out = tmp_path / "att"
    assert main(["ask", "--checkpoint", str(shared_checkpoint()), "--device", "cpu", str(pic), COLOR_Q,
                 "--attention-out", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["answer"] == "red" and "attention.npz" in printed["attention_files"]
    expected = pred.explain(str(pic), COLOR_Q)
    with np.load(out / "attention.npz") as z:
        np.testing.assert_allclose(z["cross_weights"], expected.cross_weights, atol=1e-6)
        np.testing.assert_allclose(z["vit_weights"], expected.vit_weights, atol=1e-6)
    assert main(["caption", "--checkpoint", str(shared_checkpoint()), "--device", "cpu", str(pic),
                 "--attention-out", str(tmp_path / "cap")]) == 0
    assert (tmp_path / "cap" / "cross_attention_03_circle.png").is_file()
