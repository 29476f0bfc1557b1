"""The model: positions, attention, causality, cross-attention, the loss, overfitting, ViT weights, presets and
the errors bad input gets."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_causal, make_batch, overfit_model, random_images, tiny_config, tiny_model

from vqa.config import PRESETS, ModelConfig, preset
from vqa.decoding.step import StaticKVCache
from vqa.errors import ConfigError, InputError
from vqa.model import Attention, VQAModel, sinusoidal_positions


def _ids(rows: list[list[int]]) -> torch.Tensor:
    return torch.as_tensor(rows, dtype=torch.long)


# ---------------------------------------------------------------- positions


def test_sinusoidal_positions_match_vaswani_formula_by_hand():
    d = 16
    pe = sinusoidal_positions(50, d)
    assert pe.shape == (50, d) and pe.dtype == torch.float32
    # PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d))
    assert pe[0, 0::2].abs().max() == 0 and torch.all(pe[0, 1::2] == 1)
    assert pe[1, 0] == pytest.approx(math.sin(1.0), abs=1e-6)
    assert pe[1, 1] == pytest.approx(math.cos(1.0), abs=1e-6)
    assert pe[7, 4] == pytest.approx(math.sin(7 / 10000 ** (4 / 16)), abs=1e-6)  # i = 2
    assert pe[7, 5] == pytest.approx(math.cos(7 / 10000 ** (4 / 16)), abs=1e-6)
    assert pe[49, 14] == pytest.approx(math.sin(49 / 10000 ** (14 / 16)), abs=1e-6)  # i = 7, the last pair
    assert pe[49, 15] == pytest.approx(math.cos(49 / 10000 ** (14 / 16)), abs=1e-6)
    assert pe[23, 9] == pytest.approx(math.cos(23 / 10000 ** (8 / 16)), abs=1e-6)  # i = 4


def test_the_decoder_uses_the_sinusoidal_table_and_learned_positions_replace_it():
    sin = tiny_model()
    assert torch.equal(sin.decoder.pe, sinusoidal_positions(sin.cfg.dec_max_len, sin.cfg.dec_width))
    learned = tiny_model(dec_positions="learned")
    assert not hasattr(learned.decoder, "pe")
    assert learned.decoder.pos.weight.shape == (learned.cfg.dec_max_len, learned.cfg.dec_width)
    assert learned.decoder.pos.weight.requires_grad
    # the learned table is really what the decoder adds
    images = random_images(1, learned.cfg)
    ids = _ids([[1, 5, 6, 7]])
    before = learned(images, ids).logits
    with torch.no_grad():
        learned.decoder.pos.weight[2] += 1.0
    after = learned(images, ids).logits
    assert torch.allclose(before[:, :2], after[:, :2], atol=1e-6) and not torch.allclose(before[:, 2:], after[:, 2:])


def test_unknown_position_kind_is_a_config_error():
    with pytest.raises(ConfigError, match="dec_positions"):
        tiny_config(dec_positions="rotary")


# ---------------------------------------------------------------- attention


def _attention_pair(cross: bool, seed: int = 0):
    torch.manual_seed(seed)
    attn = Attention(32, 4, cross=cross).eval()
    x = torch.randn(2, 6, 32)
    return attn, x


def test_attention_weights_path_equals_sdpa_self_causal():
    attn, x = _attention_pair(cross=False)
    out, none = attn(x)
    out_w, w = attn(x, need_weights=True)
    assert none is None
    torch.testing.assert_close(out_w, out, atol=1e-5, rtol=1e-5)
    assert w.shape == (2, 4, 6, 6)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 6))
    assert torch.all(w.triu(1) == 0)  # causal: no weight on later keys


def test_attention_weights_path_equals_sdpa_with_an_explicit_mask():
    attn, x = _attention_pair(cross=False, seed=1)
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    mask = mask.expand(2, 1, 6, 6).clone()
    mask[0, :, 2:, 0] = False  # row 0: key 0 is hidden from queries 2..5
    out, _ = attn(x, mask=mask)
    out_w, w = attn(x, mask=mask, need_weights=True)
    torch.testing.assert_close(out_w, out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 6))
    assert torch.all(w[0, :, 2:, 0] == 0) and torch.all(w[1, :, 2:, 0] > 0)


def test_attention_weights_path_equals_sdpa_over_a_cache():
    attn, x = _attention_pair(cross=False, seed=2)
    full, _ = attn(x)
    buffers = [(torch.zeros(2, 4, 6, 8), torch.zeros(2, 4, 6, 8)) for _ in range(2)]  # [B, H, slots, Dh]
    for k, v in buffers:  # the first 5 tokens into slots 0..4 (the decode path's prefill)
        attn(x[:, :5], mask=torch.ones(5, 5, dtype=torch.bool).tril()[None, None],
             cache=StaticKVCache(k, v, torch.arange(5), visible=5, empty=True))
    (k, v), (k_w, v_w) = buffers
    step_mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    last, _ = attn(x[:, 5:], mask=step_mask, cache=StaticKVCache(k, v, torch.tensor([5])))
    # one query over a cache: causal = all keys
    last_w, w = attn(x[:, 5:], cache=StaticKVCache(k_w, v_w, torch.tensor([5])), need_weights=True)
    torch.testing.assert_close(last, full[:, 5:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(last_w, full[:, 5:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 1))


def test_attention_weights_path_equals_sdpa_cross():
    attn, x = _attention_pair(cross=True, seed=3)
    memory = torch.randn(2, 9, 32)
    kv = attn.project_kv(memory)
    assert kv[0].shape == (2, 4, 9, 8)
    out, _ = attn(x, kv=kv)
    out_w, w = attn(x, kv=kv, need_weights=True)
    torch.testing.assert_close(out_w, out, atol=1e-5, rtol=1e-5)
    assert w.shape == (2, 4, 6, 9)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 6))
    assert torch.all(w > 0)  # cross-attention is not causal: every query sees every image token


def test_one_query_attention_of_the_compiled_step_equals_sdpa():
    """The written-out single-query attention that a compiled decode step uses: SDPA's output, with a key mask
    that differs per row (self-attention over a cache) and without one (cross-attention)."""
    from vqa.model.attention import _one_query_attention

    torch.manual_seed(0)
    q, k, v = torch.randn(3, 4, 1, 8), torch.randn(3, 4, 11, 8), torch.randn(3, 4, 11, 8)
    mask = torch.rand(3, 1, 1, 11) > 0.4
    mask[..., 0] = True  # every row sees at least one key
    for m in (mask, None):
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        torch.testing.assert_close(_one_query_attention(q, k, v, m), want, atol=1e-6, rtol=1e-5)
    hidden = _one_query_attention(q, k, v, mask)
    k2 = k.clone()
    k2[~mask.expand(3, 4, 1, 11)[:, :, 0]] = 100.0  # masked keys changed: the output is not
    torch.testing.assert_close(_one_query_attention(q, k2, v, mask), hidden)


def test_attention_refuses_a_width_its_heads_do_not_divide():
    with pytest.raises(ValueError) as e:
        Attention(30, 4)
    assert str(e.value) == "dim=30 is not divisible by heads=4"


class _GrowingCache:
    """The reference cache: keys and values concatenated as they come; `len` = how many tokens it holds."""

    def __init__(self):
        self.k = self.v = None
        self.len = 0

    def append(self, k, v):
        self.k = k if self.k is None else torch.cat([self.k, k], 2)
        self.v = v if self.v is None else torch.cat([self.v, v], 2)
        self.len += k.shape[2]
        return self.k, self.v


def test_a_multi_token_step_over_a_cache_needs_a_mask_and_with_one_equals_the_uncached_pass():
    attn, x = _attention_pair(cross=False, seed=4)
    full, _ = attn(x[:, :3])  # three tokens at once, causal
    cache = _GrowingCache()
    attn(x[:, :1], cache=cache)  # one token cached ...
    # ... then two at once: query i (position 1 + i) sees keys 0..1 + i, built by hand
    mask = torch.ones(2, 3, dtype=torch.bool).tril(diagonal=1)[None, None]
    two, _ = attn(x[:, 1:3], mask=mask, cache=cache)
    torch.testing.assert_close(two, full[:, 1:3], atol=1e-5, rtol=1e-5)
    cache = _GrowingCache()
    attn(x[:, :1], cache=cache)
    assert cache.len == 1
    with pytest.raises(ValueError) as e:  # without a mask it cannot know which keys each query may see
        attn(x[:, 1:3], cache=cache)
    assert str(e.value) == "a multi-token step over a cache needs an explicit mask"


@pytest.mark.parametrize("t", [1, 6])
def test_attention_dropout_applies_in_training_only(t):
    torch.manual_seed(5)
    attn = Attention(32, 4, dropout=0.5)
    plain = Attention(32, 4, dropout=0.0)
    plain.load_state_dict(attn.state_dict())
    x = torch.randn(2, t, 32)
    with torch.no_grad():
        want = plain.eval()(x)[0]
        torch.testing.assert_close(attn.eval()(x)[0], want)  # eval: no dropout
        attn.train()
        a, b = attn(x)[0], attn(x)[0]
    # training: weights dropped at random (by far more than rounding), a different draw each call
    assert (a - want).abs().max() > 1e-2 and (a - b).abs().max() > 1e-2


def test_capture_records_each_calls_weights_and_scores_and_leaves_the_output_unchanged():
    from vqa.model.attention import AttentionRecord

    attn, x = _attention_pair(cross=False, seed=6)
    mask = torch.ones(6, 6, dtype=torch.bool).tril().expand(2, 1, 6, 6).clone()
    mask[1, :, 3:, 1] = False
    plain, _ = attn(x, mask=mask)
    attn.capture = []
    try:
        out, _ = attn(x, mask=mask)
        attn(x[:, :4])
        records = attn.capture
    finally:
        attn.capture = None
    torch.testing.assert_close(out, plain, atol=1e-5, rtol=1e-5)
    assert len(records) == 2 and all(isinstance(r, AttentionRecord) for r in records)
    # the reference: q.k / sqrt(8) from the module's own projection, -inf where the mask forbids
    q, k, _ = F.linear(x, attn.qkv.weight, attn.qkv.bias).view(2, 6, 3, 4, 8).permute(2, 0, 3, 1, 4)
    raw = q @ k.transpose(-2, -1) / math.sqrt(8)
    for record, want in ((records[0], raw.masked_fill(~mask, float("-inf"))),
                         (records[1], raw[:, :, :4, :4].masked_fill(~torch.ones(4, 4, dtype=torch.bool).tril(),
                                                                    float("-inf")))):  # the second call: causal
        torch.testing.assert_close(record.scores, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(record.weights, want.softmax(-1), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("cross", [False, True])
def test_qk_norm_normalizes_each_heads_queries_and_keys_and_the_weights_path_agrees(cross):
    torch.manual_seed(4)
    attn = Attention(32, 4, cross=cross, qk_norm=True).eval()
    plain = Attention(32, 4, cross=cross).eval()
    plain.load_state_dict(attn.state_dict(), strict=False)  # same projections, no norms
    with torch.no_grad():
        for lin in [attn.q, attn.kv] if cross else [attn.qkv]:
            lin.weight.mul_(0.01), lin.bias.mul_(0.01)  # tiny queries/keys: near-uniform attention unless they are normalized
    x, memory = torch.randn(2, 6, 32), torch.randn(2, 9, 32)
    kv = attn.project_kv(memory) if cross else None
    k = kv[0] if cross else attn.k_norm(attn.qkv(x).view(2, 6, 3, 4, 8)[:, :, 1].transpose(1, 2))
    torch.testing.assert_close(k.mean(-1), torch.zeros(2, 4, k.shape[2]), atol=1e-5, rtol=0)  # LayerNorm per head
    out, _ = attn(x, kv=kv)
    out_w, w = attn(x, kv=kv, need_weights=True)
    torch.testing.assert_close(out_w, out, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        for lin in [plain.q, plain.kv] if cross else [plain.qkv]:
            lin.weight.mul_(0.01), lin.bias.mul_(0.01)
    _, w_plain = plain(x, kv=plain.project_kv(memory) if cross else None, need_weights=True)
    rows = slice(None) if cross else slice(3, None)  # self: queries that see at least 4 keys
    uniform = (1 / 9) if cross else (1 / 4)
    assert w_plain[..., rows, :].max() < 1.2 * uniform  # tiny projections: near-uniform attention without the norms
    assert w[..., rows, :].max() > 2 * uniform  # unit-scale logits with them: already selective


def test_qk_norm_decoder_is_still_causal_and_the_flags_reach_the_model():
    model = tiny_model(dec_qk_norm=True, vit_qk_norm=True).eval()
    assert all(isinstance(b.self_attn.q_norm, torch.nn.LayerNorm) for b in model.decoder.blocks)
    assert all(isinstance(b.cross_attn.k_norm, torch.nn.LayerNorm) for b in model.decoder.blocks)
    assert all(isinstance(b.attn.q_norm, torch.nn.LayerNorm) for b in model.vision.vit.blocks)
    images = random_images(1, model.cfg)
    ids = _ids([[1, 5, 6, 7, 8, 9]])
    with torch.no_grad():
        a = model(images, ids).logits
        b = model(images, _ids([[1, 5, 6, 7, 8, 20]])).logits
    torch.testing.assert_close(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5], b[:, 5])


def test_one_attention_class_serves_self_and_cross_attention():
    model = tiny_model()
    for blk in model.decoder.blocks:
        assert type(blk.self_attn) is Attention and type(blk.cross_attn) is Attention
        assert not blk.self_attn.cross and blk.cross_attn.cross
    assert len(model.decoder.blocks) == model.cfg.dec_depth


def test_lm_head_is_tied_to_the_embedding():
    model = tiny_model()
    dec, cfg = model.decoder, model.cfg
    vd = [p for p in model.parameters() if p.shape == (cfg.vocab_size, cfg.dec_width)]
    assert len(vd) == 1 and vd[0] is dec.embed.weight  # no second [V, D] matrix anywhere
    head = getattr(dec, "lm_head", None) or getattr(model, "lm_head", None)
    if head is not None:
        assert head.weight.data_ptr() == dec.embed.weight.data_ptr()
    h = torch.randn(3, cfg.dec_width)
    torch.testing.assert_close(dec.logits(h), h @ dec.embed.weight.t())
    # a gradient through the head alone reaches the embedding
    dec.logits(h).sum().backward()
    assert dec.embed.weight.grad is not None and dec.embed.weight.grad.abs().sum() > 0


# ---------------------------------------------------------------- the joined model


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_causality_a_later_token_never_changes_earlier_logits(positions):
    assert_causal(tiny_model(dec_positions=positions), min_change=1e-4)  # and every later position does change


def test_cross_attention_is_used_different_images_give_different_logits():
    model = tiny_model()
    images = random_images(2, model.cfg)
    ids = _ids([[1, 5, 9, 13]] * 2)
    logits = model(images, ids).logits
    assert (logits[0] - logits[1]).abs().amax(-1).min() > 1e-3  # at every position
    same = model(images[:1].expand(2, -1, -1, -1), ids).logits
    torch.testing.assert_close(same[0], same[1])
    # image_index routes text rows to images
    swapped = model(images, ids, image_index=torch.tensor([1, 0])).logits
    torch.testing.assert_close(swapped[0], logits[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(swapped[1], logits[0], atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_loss_ignores_prompt_and_padding_and_targets_are_shifted_by_one():
    model = tiny_model()
    cfg = model.cfg
    images = random_images(2, cfg)
    prompts = [[1, 5, 6], [1, 7, 8, 9, 10]]
    targets = [[20, 21, 2], [23, 24, 25, 2]]
    ids, mask = make_batch(prompts, targets, cfg.pad_id)  # row 0: 6 tokens then 3 of right padding
    assert ids.shape == (2, 9) and ids[0, 6:].tolist() == [cfg.pad_id] * 3
    out = model(images, ids, loss_mask=mask)
    assert out.n_targets == 7
    logp = out.logits.log_softmax(-1)
    # by hand: position t predicts token t+1, only target tokens count
    terms = []
    for b, (p, t) in enumerate(zip(prompts, targets, strict=True)):
        for k, tok in enumerate(t):
            pos = len(p) + k
            terms.append(-logp[b, pos - 1, tok])
    expected = torch.stack(terms).mean()
    torch.testing.assert_close(out.loss, expected, atol=1e-5, rtol=1e-5)
    # off by one in either direction would give another number
    for shift in (0, 2):
        wrong = torch.stack(
            [-logp[b, len(p) + k - shift, tok] for b, (p, t) in enumerate(zip(prompts, targets, strict=True)) for k, tok in enumerate(t)]
        ).mean()
        assert abs(float(wrong) - float(expected)) > 1e-3
    # padding: other pad ids after the end change nothing; the prompt tokens are never predicted
    repadded = ids.clone()
    repadded[0, 6:] = 33
    torch.testing.assert_close(model(images, repadded, loss_mask=mask).loss, out.loss)
    # a loss_mask on the prompt too would count the prompt: the code must not be doing that already
    everything = mask.clone()
    everything[0, 1 : len(prompts[0])] = True
    assert abs(float(model(images, ids, loss_mask=everything).loss) - float(out.loss)) > 1e-3
    # the loss alone (no logits) is the same number
    alone = model(images, ids, loss_mask=mask, return_logits=False)
    assert alone.logits is None
    torch.testing.assert_close(alone.loss, out.loss)
    # and it is the plain cross-entropy of the shifted, selected positions
    sel = mask[:, 1:]
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits[:, :-1][sel], ids[:, 1:][sel]), atol=1e-5, rtol=1e-5)


def test_tiny_model_overfits_8_triples_until_greedy_reproduces_every_target():
    from vqa.decoding.generate import generate

    model, images, prompts, targets, steps = overfit_model()
    assert len(targets) == 8 and len(set(map(tuple, prompts))) == 4  # pairs share a prompt: images must decide
    got = generate(model, prompts, images, max_new_tokens=8).sequences
    assert got == targets, f"after {steps} steps"
    # one by one as well
    for i in range(8):
        assert generate(model, [prompts[i]], images[i : i + 1], max_new_tokens=8).sequences[0] == targets[i]


# ---------------------------------------------------------------- the image encoder


def test_memory_is_the_cls_token_then_the_patches():
    cfg = tiny_config()
    grid = cfg.vit_image_size // cfg.vit_patch_size
    images = random_images(2, cfg)
    model = tiny_model()
    assert model.vision.grid == grid and model.vision.num_prefix == 1
    assert model.encode(images).shape == (2, 1 + grid * grid, cfg.dec_width)


def test_vit_pretrained_asks_timm_for_its_weights_and_a_checkpoint_never_does(monkeypatch, tmp_path):
    import timm

    asked, real = [], timm.create_model

    def spy(name, pretrained=False, **kwargs):
        asked.append(pretrained)
        return real(name, pretrained=False, **kwargs)  # no download in the tests

    monkeypatch.setattr(timm, "create_model", spy)
    model = tiny_model(vit_pretrained=True)
    assert asked == [True]
    model.save_pretrained(tmp_path / "m")
    VQAModel.from_pretrained(tmp_path / "m")
    assert asked == [True, False]  # a checkpoint brings its own weights


def test_dec_dropout_drops_in_training_only():
    images, ids = random_images(1, tiny_config()), _ids([[1, 5, 6, 7, 8]])
    with torch.no_grad():
        for p, random_in_training in ((0.0, False), (0.5, True)):
            model = tiny_model(dec_dropout=p)
            torch.testing.assert_close(model(images, ids).logits, model(images, ids).logits)  # eval: no dropout
            model.train()
            a, b = model(images, ids).logits, model(images, ids).logits
            assert (not torch.allclose(a, b)) is random_in_training


def test_vit_freeze_leaves_vit_params_without_grad():
    model = tiny_model(vit_freeze=True)
    model.train()
    assert all(not p.requires_grad for p in model.vision.vit.parameters())
    assert all(p.requires_grad for p in model.vision.proj.parameters())
    assert all(p.requires_grad for p in model.decoder.parameters())
    ids, mask = make_batch([[1, 5]], [[6, 2]])
    model(random_images(1, model.cfg), ids, loss_mask=mask).loss.backward()
    assert all(p.grad is None for p in model.vision.vit.parameters())
    assert model.vision.proj.weight.grad is not None
    assert model.num_parameters(trainable_only=True) == model.num_parameters() - sum(
        p.numel() for p in model.vision.vit.parameters()
    )
    unfrozen = tiny_model()
    assert all(p.requires_grad for p in unfrozen.vision.vit.parameters())


@pytest.mark.parametrize("suffix", ["safetensors", "pth"])
def test_vit_weights_saved_to_a_local_file_load_back_identically(tmp_path, suffix):
    source = tiny_model(seed=1)
    state = source.vision.vit.state_dict()
    path = tmp_path / f"vit.{suffix}"
    if suffix == "safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    else:
        torch.save(state, path)
    loaded = tiny_model(seed=2, vit_weights=str(path)).vision.vit.state_dict()
    fresh = tiny_model(seed=2).vision.vit.state_dict()  # the same seed without the file
    assert loaded.keys() == state.keys()
    for k in state:
        assert torch.equal(loaded[k], state[k]), k
    assert not all(torch.equal(fresh[k], state[k]) for k in state if state[k].is_floating_point())
    assert not torch.equal(fresh["patch_embed.proj.weight"], state["patch_embed.proj.weight"])


def test_missing_vit_weights_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no file"):
        tiny_model(vit_weights=str(tmp_path / "nowhere.safetensors"))


# ---------------------------------------------------------------- presets


def _meta_count(name: str) -> tuple[int, VQAModel]:
    with torch.device("meta"):
        model = VQAModel(preset(name))
    return model.num_parameters(), model


@pytest.mark.parametrize(
    "name, low, high",
    [("tiny", 0.3e6, 2e6), ("small", 30e6, 45e6), ("base", 140e6, 190e6)],
)
def test_preset_parameter_counts(name, low, high):
    n, model = _meta_count(name)
    assert low <= n <= high, f"{name}: {n / 1e6:.1f} M parameters"
    cfg = preset(name)
    assert model.decoder.embed.weight.shape == (cfg.vocab_size, cfg.dec_width)
    assert len(model.decoder.blocks) == cfg.dec_depth
    g = cfg.vit_image_size // cfg.vit_patch_size
    assert tuple(model.vision.vit.patch_embed.grid_size) == (g, g)
    if not cfg.vit_conv_stem:  # tiny: a convolutional stem in place of the patch projection
        assert model.vision.vit.patch_embed.proj.weight.shape[-1] == cfg.vit_patch_size


def test_preset_overrides_and_names():
    assert set(PRESETS) == {"tiny", "small", "base", "small-gpt2", "base-gpt2"}
    cfg = preset("tiny", vocab_size=77, dec_depth=1)
    assert (cfg.vocab_size, cfg.dec_depth, cfg.dec_width) == (77, 1, 96)


# ---------------------------------------------------------------- bad input


def test_unknown_preset_names_it_and_the_choices():
    with pytest.raises(ConfigError, match="'huge'") as e:
        preset("huge")
    assert "tiny" in str(e.value) and "small" in str(e.value) and "base" in str(e.value)


def test_unknown_timm_model_names_it():
    with pytest.raises(ConfigError, match="vit_nonexistent_patch9"):
        VQAModel(tiny_config(vit_name="vit_nonexistent_patch9"))


def test_a_timm_model_that_is_not_a_vit_is_a_config_error():
    with pytest.raises(ConfigError, match="resnet18"):
        VQAModel(tiny_config(vit_name="resnet18"))


def test_bad_config_values_are_config_errors():
    with pytest.raises(ConfigError, match="dec_heads"):
        tiny_config(dec_width=30, dec_heads=4)
    with pytest.raises(ConfigError, match="vit_patch_size"):
        tiny_config(vit_image_size=30)
    with pytest.raises(ConfigError, match="bogus"):
        ModelConfig.from_dict({**tiny_config().to_dict(), "bogus": 1})


@pytest.mark.parametrize(
    "shape, what",
    [((1, 3, 16, 16), "32"), ((1, 1, 32, 32), "3, 32, 32"), ((1, 4, 32, 32), "3, 32, 32"), ((3, 32, 32), "32")],
)
def test_wrong_image_size_or_channels_is_an_input_error(shape, what):
    model = tiny_model()
    with pytest.raises(InputError, match="images must be") as e:
        model.encode(torch.randn(*shape))
    assert what in str(e.value) and str(tuple(shape)) in str(e.value)  # says what it wants and what it got
    with pytest.raises(InputError, match="images"):  # through forward too (an unbatched image: a count mismatch)
        model(torch.randn(*shape), _ids([[1, 5]]))


def test_integer_images_are_an_input_error():
    with pytest.raises(InputError, match="dtype"):
        tiny_model().encode(torch.zeros(1, 3, 32, 32, dtype=torch.uint8))


def test_forward_rejects_empty_and_too_long_sequences():
    model = tiny_model()
    images = random_images(1, model.cfg)
    with pytest.raises(InputError, match="T >= 1"):
        model(images, torch.zeros(1, 0, dtype=torch.long))
    too_long = torch.ones(1, model.cfg.dec_max_len + 1, dtype=torch.long)
    with pytest.raises(InputError, match="dec_max_len=32"):
        model(images, too_long)
    model(images, torch.ones(1, model.cfg.dec_max_len, dtype=torch.long))  # exactly the maximum is fine
    with pytest.raises(InputError, match="2 images for 1 text rows"):
        model(random_images(2, model.cfg), _ids([[1, 5]]))


def test_default_config_is_still_valid():
    cfg = ModelConfig()
    assert dataclasses.asdict(cfg)["dec_positions"] == "sinusoidal"


# ---------------------------------------------------------------- convolutional stem
def test_conv_stem_replaces_the_patch_projection_and_keeps_the_token_layout(tmp_path):
    from helpers import tiny_config
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = VQAModel(tiny_config(vit_conv_stem=True)).eval()
    proj = model.vision.vit.patch_embed.proj
    assert isinstance(proj, torch.nn.Sequential)
    strides = [m.stride[0] for m in proj if isinstance(m, torch.nn.Conv2d)]
    assert math.prod(strides) == model.cfg.vit_patch_size  # the stem still cuts the image into grid x grid
    images = torch.randn(2, 3, 32, 32)
    assert model.encode(images).shape == (2, 1 + 4 * 4, model.cfg.dec_width)
    # 3x3 convolutions overlap: a pixel change just across a patch border reaches the neighbouring token
    # (a plain patch projection would leave that token unchanged)
    bumped = images.clone()
    bumped[:, :, 0, 8] += 5.0  # first pixel of patch (0, 1)
    with torch.no_grad():
        a, b = model.vision.vit.forward_features(images), model.vision.vit.forward_features(bumped)
        pa, pb = model.vision.vit.patch_embed(images), model.vision.vit.patch_embed(bumped)
    assert not torch.allclose(pa[:, 0], pb[:, 0])  # token of patch (0, 0) sees across the border
    assert not torch.allclose(a, b)
    # its weights round-trip through a local file like any timm ViT's
    save_file(model.vision.vit.state_dict(), str(tmp_path / "stem.safetensors"))
    again = VQAModel(tiny_config(vit_conv_stem=True, vit_weights=str(tmp_path / "stem.safetensors")))
    for k, v in model.vision.vit.state_dict().items():
        assert torch.equal(v, again.vision.vit.state_dict()[k]), k


def test_conv_stem_needs_a_power_of_two_patch():
    from helpers import tiny_config

    with pytest.raises(ConfigError, match="power-of-two"):
        VQAModel(tiny_config(vit_conv_stem=True, vit_image_size=36, vit_patch_size=6))



def test_causal_mask_against_a_hand_built_one():
    """vqa.model.masks.causal_mask, checked entry by entry: T queries that are the last T of S positions; query
    i sees keys 0 .. S - T + i that are real, and always its own key; the mask is made on the device asked."""
    from vqa.model.masks import causal_mask

    for t, s in ((3, 3), (2, 5), (1, 4)):
        want = torch.tensor([[k <= s - t + i for k in range(s)] for i in range(t)])
        assert torch.equal(causal_mask(t, s)[0, 0], want), (t, s)
    valid = torch.tensor([[False, True, True, True, True], [True, True, True, True, True]])
    m = causal_mask(2, 5, key_valid=valid)  # [2, 1, 2, 5]
    assert m.shape == (2, 1, 2, 5)
    assert torch.equal(m[0, 0], torch.tensor([[0, 1, 1, 1, 0], [0, 1, 1, 1, 1]], dtype=torch.bool))
    assert torch.equal(m[1, 0], torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool))
    only_self = causal_mask(3, 3, key_valid=torch.zeros(1, 3, dtype=torch.bool))[0, 0]  # all padding: own key
    assert torch.equal(only_self, torch.eye(3, dtype=torch.bool))
    assert causal_mask(2, 5, device="meta").device.type == "meta"
    assert causal_mask(2, 5, device="meta", key_valid=valid.to("meta")).device.type == "meta"
