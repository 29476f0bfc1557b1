"""Attention (vqa/model/attention.py) and its causal mask (vqa/model/masks.py): the weights path equals SDPA
(causal self-attention, an explicit mask, over a cache, cross-attention), the compiled step's one-query
attention equals SDPA, a multi-token step over a cache needs a mask, dropout in training only, the recorded
scores, QK-norm (LayerNorm, or RMSNorm with the layout's epsilon), the biases each layout has, rotary positions
in the dtype of what they turn, one class for self- and cross-attention, and causal_mask against a hand-built one."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_model

from vqa.model import Attention
from vqa.model.attention import StaticKVCache, rotate


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


def test_attention_refuses_key_value_heads_that_do_not_divide_its_heads():
    with pytest.raises(ValueError) as e:
        Attention(32, 4, kv_heads=3)
    assert str(e.value) == "heads=4 is not a multiple of kv_heads=3"


@pytest.mark.parametrize("cross", [False, True])
def test_projection_biases_follow_the_layout(cross):
    """GPT-2's and ViT's layouts have a bias on every projection (the default), Llama's on none, Qwen2's on the
    query/key/value projections only: each tensor of a checkpoint in that layout has its place, and no other."""
    inputs = ["q", "kv"] if cross else ["qkv"]

    def biased(attn):
        return {name: getattr(attn, name).bias is not None for name in [*inputs, "proj"]}

    assert biased(Attention(32, 4, cross=cross)) == dict.fromkeys([*inputs, "proj"], True)
    assert biased(Attention(32, 4, cross=cross, bias=False, out_bias=False)) == dict.fromkeys([*inputs, "proj"], False)
    assert biased(Attention(32, 4, cross=cross, out_bias=False)) == {**dict.fromkeys(inputs, True), "proj": False}


def test_rms_qk_norm_uses_the_layouts_epsilon():
    """Llama-layout decoders normalize queries and keys with RMSNorm at their config's epsilon (0.5 here, so
    that torch's default epsilon would give other values)."""
    attn = Attention(32, 4, qk_norm=True, rms_eps=0.5)
    x = torch.randn(2, 4, 6, 8)
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 0.5)  # the norms' weights start at 1
    for norm in (attn.q_norm, attn.k_norm):
        assert isinstance(norm, torch.nn.RMSNorm)
        torch.testing.assert_close(norm(x), expected)


def test_rotary_positions_keep_the_dtype_of_what_they_turn():
    """bf16 queries and keys (autocast) with float32 cos/sin tables: rotated in bf16, the dtype the cache holds,
    pairing dimension i with i + Dh/2 as Llama does."""
    x = torch.randn(1, 2, 3, 8).bfloat16()
    angle = torch.randn(1, 1, 3, 8)
    out = rotate(x, angle.cos(), angle.sin())
    assert out.dtype == torch.bfloat16
    turned = torch.cat((-x[..., 4:], x[..., :4]), dim=-1)
    assert torch.equal(out, x * angle.cos().bfloat16() + turned * angle.sin().bfloat16())


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
    plain = Attention(32, 4)  # no dropout unless asked for
    plain.load_state_dict(attn.state_dict())
    x = torch.randn(2, t, 32)
    with torch.no_grad():
        want = plain.eval()(x)[0]
        torch.testing.assert_close(plain.train()(x)[0], want)
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
            # tiny queries/keys: near-uniform attention unless they are normalized
            lin.weight.mul_(0.01), lin.bias.mul_(0.01)
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


def test_one_attention_class_serves_self_and_cross_attention():
    model = tiny_model()
    for blk in model.decoder.blocks:
        assert type(blk.self_attn) is Attention and type(blk.cross_attn) is Attention
        assert not blk.self_attn.cross and blk.cross_attn.cross
    assert len(model.decoder.blocks) == model.cfg.dec_depth


# ---------------------------------------------------------------- the causal mask


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
