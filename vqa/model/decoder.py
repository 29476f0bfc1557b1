"""The text decoder: embeddings + positions, pre-LN blocks (masked self-attention, cross-attention to the
image tokens, MLP), final LayerNorm, and an LM head tied to the embedding.

With `dec_pretrained` the same blocks hold a GPT-2 (`vqa.weights.gpt2`): the config then asks for
learned positions, no embedding scale, the tanh GELU and GPT-2's LayerNorm epsilon, and every block's
cross-attention starts with a zero output projection, so the decoder starts as the language model."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..config import ModelConfig
from .attention import Attention, ImageRoute, gather_rows


def sinusoidal_positions(max_len: int, dim: int) -> torch.Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d)) (Vaswani et al., 3.5)."""
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # [L, 1]
    inv_freq = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # [D/2]
    pe = torch.zeros(max_len, dim, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * inv_freq)
    pe[:, 1::2] = torch.cos(pos * inv_freq)
    return pe.float()


class MLP(nn.Sequential):
    def __init__(self, dim: int, ratio: float, dropout: float, activation: str = "gelu"):
        hidden = int(dim * ratio)
        act = nn.GELU(approximate="tanh" if activation == "gelu_tanh" else "none")  # tanh: GPT-2's gelu_new
        super().__init__(nn.Linear(dim, hidden), act, nn.Linear(hidden, dim), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self[2](self[1](self[0](x)))
        return _dropout(self[3], x)


def _dropout(drop: nn.Dropout, x: torch.Tensor) -> torch.Tensor:
    """`drop(x)`, skipping the module call where it is the identity (eval mode or p = 0): on the decode path
    every call costs microseconds."""
    return drop(x) if drop.training and drop.p > 0 else x


class DecoderBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, h, p, eps = cfg.dec_width, cfg.dec_heads, cfg.dec_dropout, cfg.dec_norm_eps
        self.ln1 = nn.LayerNorm(d, eps=eps)
        self.self_attn = Attention(d, h, cross=False, dropout=p, qk_norm=cfg.dec_qk_norm)
        self.ln2 = nn.LayerNorm(d, eps=eps)
        self.cross_attn = Attention(d, h, cross=True, dropout=p, qk_norm=cfg.dec_qk_norm)
        self.ln3, self.mlp = nn.LayerNorm(d, eps=eps), MLP(d, cfg.dec_mlp_ratio, p, cfg.dec_activation)
        self.drop = nn.Dropout(p)

    def forward(self, x, memory_kv, mask=None, cache=None, need_weights=False, route=None, probe=None):
        """-> (x, cross-attention weights or None). `route`: rows that mix images (`ImageRoute`); `probe`:
        image m's chosen tokens [M, Lg] as flat positions, whose weights [M, H, Lg, N] are returned instead."""
        h, _ = self.self_attn(self.ln1(x), mask=mask, cache=cache)
        x = x + _dropout(self.drop, h)
        xn = self.ln2(x)
        h, weights = self.cross_attn(xn, kv=memory_kv, need_weights=need_weights, route=route)
        if probe is not None:  # [B, T, D] -> [B * T, D] -> the probed [M, Lg, D]
            chosen = gather_rows(xn.flatten(0, 1), probe.reshape(-1)).view(*probe.shape, -1)  # [M, Lg, D]
            weights = self.cross_attn.weights_at(chosen, memory_kv[0])
        x = x + _dropout(self.drop, h)
        return x + self.mlp(self.ln3(x)), weights


class TextDecoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        """Random weights; `vqa.weights.language_model.build_model` copies `cfg.dec_pretrained`'s in."""
        super().__init__()
        self.cfg = cfg
        self.embed_scale = math.sqrt(cfg.dec_width) if cfg.dec_embed_scale else None
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dec_width)
        nn.init.normal_(self.embed.weight, std=cfg.dec_width**-0.5)  # tied: unit-variance logits, x sqrt(d) inputs
        if cfg.dec_positions == "learned":
            self.pos = nn.Embedding(cfg.dec_max_len, cfg.dec_width)
            nn.init.normal_(self.pos.weight, std=0.02 * math.sqrt(cfg.dec_width))
        else:
            self.register_buffer("pe", sinusoidal_positions(cfg.dec_max_len, cfg.dec_width), persistent=False)
        self.drop = nn.Dropout(cfg.dec_dropout)
        self.blocks = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.dec_depth))
        self.ln_f = nn.LayerNorm(cfg.dec_width, eps=cfg.dec_norm_eps)
        self.grad_checkpointing = False  # training recomputes each block in the backward pass instead of storing it

    def memory_kv(self, memory: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's cross-attention keys/values of the image tokens, computed once per image."""
        return [blk.cross_attn.project_kv(memory) for blk in self.blocks]

    def positions(self, pos: torch.Tensor) -> torch.Tensor:
        """[B, T] position ids -> [B, T, D]."""
        return self.pos(pos) if self.cfg.dec_positions == "learned" else self.pe[pos]

    def forward(
        self,
        ids: torch.Tensor,  # [B, T]
        memory_kv: list[tuple[torch.Tensor, torch.Tensor]],  # per layer, 2 x [B, H, N, Dh] ([M, ...] with a route)
        pos: torch.Tensor | int | None = None,  # [B, T] position ids, or an int p: p..p+T-1 in every row; default 0
        mask: torch.Tensor | None = None,  # bool [B, 1, T, S]; default causal
        caches: list | None = None,  # per layer, a self-attention cache (vqa.model.attention.StaticKVCache)
        need_weights: bool = False,
        route: ImageRoute | None = None,  # packed rows of several images: each token to its own image's kv
        probe: torch.Tensor | None = None,  # [M, Lg]: image m's chosen tokens, flat positions in [B * T]
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """Hidden states [B, T, D] after the final LayerNorm, and (on request) each layer's cross-attention
        weights [B, H, T, N] (with a route: image-major, [M, H, L, N]; with a probe: the probed tokens' only,
        [M, H, Lg, N])."""
        if pos is None:
            pos = 0
        if isinstance(pos, int):  # the same positions in every row: a slice of the table, no gather
            t = ids.shape[1]
            table = self.pos.weight if self.cfg.dec_positions == "learned" else self.pe
            if pos < 0 or pos + t > table.shape[0]:
                raise IndexError(f"positions {pos}..{pos + t - 1} are outside 0..{table.shape[0] - 1}")
            pe = table[pos : pos + t]  # [T, D], broadcast over the batch
        else:
            pe = self.positions(pos)
        x = self.embed(ids)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        x = _dropout(self.drop, x + pe)
        maps = [] if need_weights or probe is not None else None
        recompute = self.grad_checkpointing and self.training and torch.is_grad_enabled()
        for i, blk in enumerate(self.blocks):
            cache = None if caches is None else caches[i]
            if recompute:
                x, w = checkpoint(blk, x, memory_kv[i], mask, cache, need_weights, route, probe, use_reentrant=False)
            else:
                x, w = blk(x, memory_kv[i], mask=mask, cache=cache, need_weights=need_weights, route=route,
                           probe=probe)
            if maps is not None:
                maps.append(w)
        return self.ln_f(x), maps

    @property
    def head_weight(self) -> torch.Tensor:
        """The LM head's matrix [V, D]: the token embedding (tied)."""
        return self.embed.weight

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head, tied to the token embedding: [..., D] -> [..., V]."""
        return hidden @ self.embed.weight.t()
