"""Multi-head scaled dot-product attention: one module serves masked self-attention and cross-attention.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_head) + mask) V,   heads concatenated, then projected.

Self-attention projects Q, K, V from the text in one fused matmul; cross-attention projects Q from the text
and K, V from the image tokens (`project_kv`, done once per image and reused for every generated token).
The llama layout's decoder (`vqa.model.llama_decoder`) adds rotary positions (`rotary`: cos/sin per query
position, applied to queries and keys before the keys are cached), grouped-query attention (`kv_heads` < `heads`:
each key/value head serves heads / kv_heads query heads), a head width of its own and RMSNorm on queries and keys.
Training's rows may hold text of several images (`vqa.data.packing`): an `ImageRoute` then runs the
cross-attention core image-major, each image's queries against its own keys/values, projections staying in
the packed layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .masks import causal_mask


class _GatherRows(torch.autograd.Function):
    """x.index_select(0, index) whose backward sums the gradient rows with index_add_ on a contiguous gradient.
    Autograd's own backward of index_select takes a scatter_add_ path on the strided gradients SDPA returns,
    a slow one here, where each image's keys/values are read by several question rows."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(index)
        ctx.rows = x.shape[0]
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (index,) = ctx.saved_tensors
        out = grad.new_zeros((ctx.rows, *grad.shape[1:]))
        return out.index_add_(0, index, grad.contiguous()), None


def gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows `index` of x (dim 0), e.g. each text row's image keys/values; the same values as index_select."""
    return _GatherRows.apply(x, index) if torch.is_grad_enabled() and x.requires_grad else x.index_select(0, index)


class ImageRoute(NamedTuple):
    """Cross-attention for packed rows that mix images: the B x T packed tokens, flattened, are gathered into
    M images x L queries (`tokens`), attend to their own image's keys/values [M, H, N, Dh] (read in place, never
    copied per row), and are put back (`slots`). Padding slots in `tokens` may point anywhere: their outputs are
    never read back. (`vqa.data.packing.pack` builds both.)"""

    tokens: torch.Tensor  # [M, L] long: image m's tokens as flat positions in [B * T]
    slots: torch.Tensor  # [B * T] long: each token's place in the flat [M * L]


@dataclass
class StaticKVCache:
    """One layer's self-attention cache over fixed buffers [B, H, S, Dh] (`vqa.decoding.batch` decodes with it):
    `append` writes the new keys/values at `slot` (a tensor of T slot indices) and returns the buffers' first
    `visible` slots (None: all of them; the caller's key mask hides the slots not written yet). `len` is what
    `Attention` reads to choose plain causal attention: 0 (`empty`) says nothing was cached before, so with no
    mask the queries attend causally among themselves -- the prefill of prompts of one length."""

    k: torch.Tensor
    v: torch.Tensor
    slot: torch.Tensor
    visible: int | None = None
    empty: bool = False

    @property
    def len(self) -> int:
        return 0 if self.empty else self.visible or self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # [B, H, T, Dh] into slots `slot`; in the cache's dtype (under autocast a QK-normed key comes out float32)
        self.k.index_copy_(2, self.slot, k.to(self.k.dtype))
        self.v.index_copy_(2, self.slot, v.to(self.v.dtype))
        if self.visible is not None:
            return self.k[:, :, : self.visible], self.v[:, :, : self.visible]
        return self.k, self.v


class Attention(nn.Module):
    # The explain path: set `capture` to a list and every forward appends AttentionRecord(weights, scores),
    # computed by the written-out attention instead of the fused kernel (which returns neither). Off (None)
    # by default, so answering never pays for it; `vqa.inference.explain` sets and clears it around one forward.
    capture: list | None = None

    def __init__(self, dim: int, heads: int, cross: bool = False, dropout: float = 0.0, qk_norm: bool = False,
                 *, kv_heads: int | None = None, head_dim: int | None = None, bias: bool = True,
                 out_bias: bool = True, rms_eps: float | None = None):
        """`kv_heads`: key/value heads (default `heads`); `head_dim`: default dim // heads; `bias`: on the
        query/key/value projections, `out_bias` on the output's; `rms_eps`: RMSNorm (not LayerNorm) for qk_norm."""
        super().__init__()
        if head_dim is None and dim % heads:
            raise ValueError(f"dim={dim} is not divisible by heads={heads}")
        self.head_dim = head_dim or dim // heads
        self.kv_heads = kv_heads or heads
        if heads % self.kv_heads:
            raise ValueError(f"heads={heads} is not a multiple of kv_heads={self.kv_heads}")
        self.heads, self.cross, self.dropout = heads, cross, dropout
        inner, kv_inner = heads * self.head_dim, self.kv_heads * self.head_dim
        if cross:
            self.q = nn.Linear(dim, inner, bias=bias)
            self.kv = nn.Linear(dim, 2 * kv_inner, bias=bias)
        else:
            self.qkv = nn.Linear(dim, inner + 2 * kv_inner, bias=bias)
        self.proj = nn.Linear(inner, dim, bias=out_bias)
        # optional LayerNorm of each head's queries and keys (Dehghani et al. 2023, "ViT-22B"; timm's qk_norm):
        # logits start at unit scale instead of near 0, so attention turns selective sooner when training from
        # scratch. The keys are normalized before they are cached, so cached and uncached decoding agree.
        norm = (lambda: nn.RMSNorm(self.head_dim, eps=rms_eps)) if rms_eps else (lambda: nn.LayerNorm(self.head_dim))
        self.q_norm = norm() if qk_norm else nn.Identity()
        self.k_norm = norm() if qk_norm else nn.Identity()

    def project_kv(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention keys and values of the image tokens: [B, N, D] -> 2 x [B, H, N, Dh]."""
        b, n, _ = memory.shape
        k, v = self.kv(memory).view(b, n, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        return self.k_norm(k), v

    def weights_at(self, x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Cross-attention weights [M, H, Lg, N] of chosen queries, image-major: x [M, Lg, D] (the block's normed
        stream at image m's chosen tokens) against image m's keys k [M, Hkv, N, Dh], read in place. What the
        grounding loss reads in training, written out as the explain path's attention; a method, so that FSDP
        gathers the weights for it as for `forward` (`vqa.train.sharding`)."""
        m, lg, _ = x.shape
        q = self.q_norm(self.q(x).view(m, lg, self.heads, self.head_dim).transpose(1, 2))  # [M, H, Lg, Dh]
        k, _ = _expand(k, k, self.heads // self.kv_heads)
        _, weights, _ = _attention_with_weights(q, k, k, None, False)
        return weights

    def forward(
        self,
        x: torch.Tensor,  # [B, T, D] the text stream (queries)
        kv: tuple[torch.Tensor, torch.Tensor] | None = None,  # cross: the image's keys/values from project_kv
        mask: torch.Tensor | None = None,  # bool [B or 1, 1, T, S], True = may attend; None + self = causal
        cache=None,  # self-attention: past keys/values (`len`, `append`; a StaticKVCache), extended in place
        need_weights: bool = False,
        route: ImageRoute | None = None,  # cross: packed rows of several images (kv then per image, [M, ...])
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,  # self: cos, sin [B or 1, 1, T, Dh] per query
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(output [B, T, D], weights [B, H, T, S] or None; with a route [M, H, L, S], image-major)."""
        # einops-free head split/merge: plain views, a few microseconds less per call on the decode path
        b, t, _ = x.shape
        d = self.heads * self.head_dim  # the attention's inner width (the model width unless head_dim is set)
        bq, tq = b, t  # the attention core's rows and queries: [B, T], or [M, L] image-major with a route
        if self.cross:
            q = self.q(x)  # [B, T, D]
            if route is not None:  # [B, T, D] -> [B * T, D] -> the image-major [M * L, D] -> [M, L, D]
                bq, tq = route.tokens.shape
                q = gather_rows(q.reshape(b * t, d), route.tokens.reshape(-1)).view(bq, tq, d)
            q = self.q_norm(q.view(bq, tq, self.heads, self.head_dim).transpose(1, 2))  # [bq, H, tq, Dh]
            k, v = kv
            causal = False
        else:
            if self.kv_heads == self.heads:
                q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
            else:  # [B, T, (H + 2 Hkv) Dh] -> [B, H, T, Dh], 2 x [B, Hkv, T, Dh]
                kv_inner = self.kv_heads * self.head_dim
                q, k, v = (z.view(b, t, -1, self.head_dim).transpose(1, 2)
                           for z in self.qkv(x).split([d, kv_inner, kv_inner], -1))
            q, k = self.q_norm(q), self.k_norm(k)
            if rotary is not None:
                q, k = rotate(q, *rotary), rotate(k, *rotary)
            past = 0
            if cache is not None:
                past = cache.len
                k, v = cache.append(k, v)  # [B, H, past + T, Dh]
            # without a mask the queries are the whole sequence from position 0 (no cache, or an empty one):
            # plain causal attention; one query over a cache sees every cached key
            causal = mask is None and past == 0
            if mask is None and past > 0 and t > 1:
                raise ValueError("a multi-token step over a cache needs an explicit mask")
        groups = self.heads // self.kv_heads  # each key/value head serves `groups` consecutive query heads
        dropout = self.dropout if self.training else 0.0
        if need_weights or self.capture is not None:
            out, weights, scores = _attention_with_weights(q, *_expand(k, v, groups), mask, causal)
            if self.capture is not None:
                self.capture.append(AttentionRecord(weights, scores))
        elif tq == 1 and not causal and dropout == 0.0 and torch.compiler.is_compiling():
            out, weights = _one_query_attention(q, *_expand(k, v, groups), mask), None
        else:  # SDPA reads the shared key/value heads in place (enable_gqa)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal,
                                                 enable_gqa=groups > 1)
            weights = None
        out = out.transpose(1, 2).reshape(bq, tq, d)  # [bq, H, tq, Dh] -> [bq, tq, D]
        if route is not None:  # the image-major [M * L, D] back to the packed [B * T, D] -> [B, T, D]
            out = gather_rows(out.reshape(bq * tq, d), route.slots).view(b, t, d)
        return self.proj(out), weights


def _expand(k: torch.Tensor, v: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped-query keys/values [B, Hkv, S, Dh] -> [B, Hkv * groups, S, Dh], each head repeated for its group."""
    return (k, v) if groups == 1 else (k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions (Su et al. 2021) in Llama's layout: dimension i pairs with i + Dh/2.
    x [B, H, T, Dh]; cos, sin [B or 1, 1, T, Dh]."""
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # [B, H, T, Dh]
    return x * cos.to(x.dtype) + turned * sin.to(x.dtype)


class AttentionRecord(NamedTuple):
    """What one attention call computed: both steps of softmax(Q K^T / sqrt(d)) for every head."""

    weights: torch.Tensor  # [B, H, T, S] after the softmax: each query's row sums to 1
    scores: torch.Tensor  # [B, H, T, S] the raw scaled scores q.k / sqrt(d); -inf where the mask forbids


def _one_query_attention(q, k, v, mask):
    """softmax(q k^T / sqrt(d)) v for one query per row (a decode step), as products and sums: inside a compiled
    step inductor fuses them into one pass over the keys and one over the values, where SDPA's CPU kernel,
    blocked for long queries, is slower at tiny's sizes (docs/results/performance.md). Same result.
    q [B, H, 1, Dh], k and v [B, H, S, Dh], mask bool [B or 1, 1, 1, S] (True = may attend) or None."""
    scores = (q * k).sum(-1) * (1.0 / math.sqrt(q.shape[-1]))  # [B, H, S]
    if mask is not None:
        scores = scores.masked_fill(~mask[:, :, 0], float("-inf"))
    return (scores.softmax(-1).unsqueeze(-1) * v).sum(-2, keepdim=True)  # [B, H, S, 1] x [B, H, S, Dv] -> [B, H, 1, Dv]


def _attention_with_weights(q, k, v, mask, causal):
    """The same attention written out: the output, the weights and the raw scaled scores [B, H, T, S]
    (masked entries -inf), for the demo's maps and the attention explorer."""
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # [B, H, T, S]
    if causal:
        mask = causal_mask(*scores.shape[-2:], q.device)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ v, weights, scores
