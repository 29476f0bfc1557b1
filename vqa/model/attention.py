"""Multi-head scaled dot-product attention: one module serves masked self-attention and cross-attention.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_head) + mask) V,   heads concatenated, then projected.

Self-attention projects Q, K, V from the text in one fused matmul; cross-attention projects Q from the text
and K, V from the image tokens (`project_kv`, done once per image and reused for every generated token).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .masks import causal_mask


class _GatherRows(torch.autograd.Function):
    """x.index_select(0, index) whose backward sums the gradient rows with index_add_ on a contiguous gradient.
    Autograd's own backward of index_select takes a scatter_add_ path on the strided gradients SDPA returns,
    a slow one (each image's keys/values are read by several question rows; docs/performance.md has the cost)."""

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


def rotary_table(max_len: int, dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [max_len, dim / 2] of rotary position embeddings (Su et al. 2021, "RoFormer"): pair i of a
    head's features turns by angle pos * base^(-2i/dim)."""
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # [dim / 2]
    angles = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq  # [L, dim / 2]
    return angles.cos().float(), angles.sin().float()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [..., T, Dh] by per-position angles (cos, sin broadcastable to [..., T, Dh / 2]); feature j
    pairs with j + Dh / 2 (the GPT-NeoX layout: two contiguous halves, no interleaving)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def grid_frequencies(grid: int, pairs: int) -> torch.Tensor:
    """Angular frequencies [pairs] for positions measured in patches on a `grid`-wide image: from pi per patch
    (neighbours opposite) down to pi / grid (one half-turn across the image: monotone, no wrap-around)."""
    return math.pi * torch.logspace(0, -math.log10(grid), pairs, dtype=torch.float64).float()


def rotate_2d(x: torch.Tensor, angles_x: torch.Tensor, angles_y: torch.Tensor) -> torch.Tensor:
    """2-D rotary positions on half of each head's features x [..., Dh]: the first quarter turns with x, the
    second with y (angles [..., Dh / 8] each, broadcastable), the second half stays as it is, so that a head
    can still match content wherever it lies (a fully rotated key would match a query only near its point)."""
    xa, xb, rest = x.split([x.shape[-1] // 4, x.shape[-1] // 4, x.shape[-1] // 2], dim=-1)
    return torch.cat([apply_rotary(xa, angles_x.cos(), angles_x.sin()),
                      apply_rotary(xb, angles_y.cos(), angles_y.sin()), rest], dim=-1)


class Attention(nn.Module):
    # The explain path: set `capture` to a list and every forward appends AttentionRecord(weights, scores),
    # computed by the written-out attention instead of the fused kernel (which returns neither). Off (None)
    # by default, so answering never pays for it; `vqa.inference.explain` sets and clears it around one forward.
    capture: list | None = None

    def __init__(self, dim: int, heads: int, cross: bool = False, dropout: float = 0.0, qk_norm: bool = False,
                 grid: int | None = None, rope2d: bool = False, follow: bool = False, coords: bool = False):
        """Cross-attention over a `grid` x `grid` patch memory (after any CLS / register tokens, which count as
        the image centre) can use where the patches are, counted in patches from the centre:

        - `rope2d`: 2-D rotary positions. Each image key turns by its patch's (column, row); each query by a
          point that its head computes from the text state (a linear map, starting at zero: the centre). A
          score then depends on the key's offset from that point, so one learned query finds "what lies left
          of the point" wherever the point is.
        - `follow` (with rope2d): the point starts where the same head of the layer below looked (the centroid
          of its attention, passed in as `point`); the call then also returns this layer's centroids.
        - `coords`: each head's output also carries the centroid (x, y) of its attention, through a linear map
          of its own: a head that finds an object hands on where it is, whatever its value projection keeps."""
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim={dim} is not divisible by heads={heads}")
        self.heads, self.head_dim, self.cross, self.dropout = heads, dim // heads, cross, dropout
        self.grid, self.rope2d, self.follow, self.coords = grid, rope2d, follow, coords
        if (rope2d or follow or coords) and (grid is None or not cross):
            raise ValueError("patch positions need cross-attention and the patch grid")
        if follow and not rope2d:
            raise ValueError("follow needs rope2d")
        if grid is not None:
            centre = torch.arange(grid, dtype=torch.float32) - (grid - 1) / 2
            rows, cols = torch.meshgrid(centre, centre, indexing="ij")
            self.register_buffer("patch_xy", torch.stack([cols.reshape(-1), rows.reshape(-1)], 1), persistent=False)
        if rope2d:
            if self.head_dim % 8:
                raise ValueError(f"2-D rotary positions need a head width divisible by 8, not {self.head_dim}")
            freq = grid_frequencies(grid, self.head_dim // 8)  # [Dh / 8]
            self.register_buffer("rope_freq", freq, persistent=False)
            # [G*G, Dh / 8] angles of each patch (row-major, as the tokens), per axis
            self.register_buffer("key_angles_x", cols.reshape(-1, 1) * freq, persistent=False)
            self.register_buffer("key_angles_y", rows.reshape(-1, 1) * freq, persistent=False)
            # the query points: a plain parameter (AdamW, not Muon), zero so that every head starts at the centre
            self.q_point = nn.Parameter(torch.zeros(2 * heads, dim))
        if cross:
            self.q = nn.Linear(dim, dim)
            self.kv = nn.Linear(dim, 2 * dim)
        else:
            self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        if coords:  # [2H] centroids (in half-grids: -1..1) -> [D]
            self.coord_proj = nn.Linear(2 * heads, dim, bias=False)
        # optional LayerNorm of each head's queries and keys (Dehghani et al. 2023, "ViT-22B"; timm's qk_norm):
        # logits start at unit scale instead of near 0, so attention turns selective sooner when training from
        # scratch. The keys are normalized before they are cached, so cached and uncached decoding agree.
        self.q_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()

    def project_kv(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention keys and values of the image tokens: [B, N, D] -> 2 x [B, H, N, Dh] (the values
        [B, H, N, Dh + 2] with `follow` or `coords`: each token's (x, y) in two more columns, so that the
        attention output's last two are the centroid)."""
        b, n, _ = memory.shape
        k, v = self.kv(memory).view(b, n, 2, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        k = self.k_norm(k)
        if self.grid is not None:
            prefix = n - self.patch_xy.shape[0]  # CLS / register tokens first: at the centre
            if self.rope2d:
                pad = self.key_angles_x.new_zeros(prefix, self.key_angles_x.shape[1])
                k = rotate_2d(k, torch.cat([pad, self.key_angles_x]), torch.cat([pad, self.key_angles_y]))
            if self.follow or self.coords:
                xy = torch.cat([self.patch_xy.new_zeros(prefix, 2), self.patch_xy]).to(v.dtype)  # [N, 2]
                v = torch.cat([v, xy.expand(b, self.heads, n, 2)], dim=-1)  # [B, H, N, Dh + 2]
        return k, v

    def query_angles(self, x: torch.Tensor, start: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Each head's query point from the text state x [B, T, D], as angles 2 x [B, H, T, Dh / 8]: `start`
        [B, H, T, 2] (default the centre) moved by at most half the grid (tanh of a linear map)."""
        b, t, _ = x.shape
        half = self.grid / 2
        point = half * torch.tanh(F.linear(x, self.q_point)).view(b, t, self.heads, 2).transpose(1, 2)  # [B, H, T, 2]
        if start is not None:
            point = point + start
        return point[..., :1] * self.rope_freq, point[..., 1:] * self.rope_freq

    def forward(
        self,
        x: torch.Tensor,  # [B, T, D] the text stream (queries)
        kv: tuple[torch.Tensor, torch.Tensor] | None = None,  # cross: the image's keys/values from project_kv
        mask: torch.Tensor | None = None,  # bool [B or 1, 1, T, S], True = may attend; None + self = causal
        cache=None,  # self-attention: past keys/values (`len`, `append`; a StaticKVCache), extended in place
        need_weights: bool = False,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,  # self: cos, sin [B or 1, 1, T, Dh / 2]
        point: torch.Tensor | None = None,  # cross with follow: [B, H, T, 2] the layer below's centroids
    ) -> tuple[torch.Tensor, ...]:
        """(output [B, T, D], weights [B, H, T, S] or None); with `follow` also this layer's attention
        centroids [B, H, T, 2] (patches from the centre)."""
        # einops-free head split/merge: plain views, a few microseconds less per call on the decode path
        b, t, d = x.shape
        if self.cross:
            q = self.q_norm(self.q(x).view(b, t, self.heads, self.head_dim).transpose(1, 2))
            if self.rope2d:
                q = rotate_2d(q, *self.query_angles(x, point))
            k, v = kv
            causal = False
        else:
            q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
            q, k = self.q_norm(q), self.k_norm(k)
            if rope is not None:  # rotated by their own positions before caching: cached == uncached
                q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
            past = 0
            if cache is not None:
                past = cache.len
                k, v = cache.append(k, v)  # [B, H, past + T, Dh]
            # without a mask the queries are the whole sequence from position 0 (no cache, or an empty one):
            # plain causal attention; one query over a cache sees every cached key
            causal = mask is None and past == 0
            if mask is None and past > 0 and t > 1:
                raise ValueError("a multi-token step over a cache needs an explicit mask")
        dropout = self.dropout if self.training else 0.0
        if need_weights or self.capture is not None:
            out, weights, scores = _attention_with_weights(q, k, v, mask, causal)
            if self.capture is not None:
                self.capture.append(AttentionRecord(weights, scores))
        elif t == 1 and not causal and dropout == 0.0 and torch.compiler.is_compiling():
            out, weights = _one_query_attention(q, k, v, mask), None
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal)
            weights = None
        if not (self.follow or self.coords):
            return self.proj(out.transpose(1, 2).reshape(b, t, d)), weights
        out, centroid = out.split([self.head_dim, 2], dim=-1)  # [B, H, T, Dh + 2]: values, where attention went
        y = self.proj(out.transpose(1, 2).reshape(b, t, d))
        if self.coords:  # [B, H, T, 2] -> [B, T, 2H], in half-grids
            y = y + self.coord_proj(centroid.transpose(1, 2).reshape(b, t, 2 * self.heads) * (2 / self.grid))
        return (y, weights, centroid) if self.follow else (y, weights)


class AttentionRecord(NamedTuple):
    """What one attention call computed: both steps of softmax(Q K^T / sqrt(d)) for every head."""

    weights: torch.Tensor  # [B, H, T, S] after the softmax: each query's row sums to 1
    scores: torch.Tensor  # [B, H, T, S] the raw scaled scores q.k / sqrt(d); -inf where the mask forbids


def _one_query_attention(q, k, v, mask):
    """softmax(q k^T / sqrt(d)) v for one query per row (a decode step), as products and sums: inside a compiled
    step inductor fuses them into one pass over the keys and one over the values, where SDPA's CPU kernel,
    blocked for long queries, took 1.6-2x as long at tiny's sizes (docs/performance.md). Same result.
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
