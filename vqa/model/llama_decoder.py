"""The text decoder in the llama layout (`dec_layout="llama"`): a Llama / Qwen language model with gated
cross-attention blocks inserted before every `dec_cross_every`-th layer (Flamingo, Alayrac et al. 2022;
Llama 3.2 Vision's mllama).

    x = embed(ids)                                                 no embedding scale, no added positions
    for layer i:  if i % k == 0:  x = CrossBlock(x, image)         x + tanh(g_attn) attn(x) + tanh(g_mlp) mlp(x)
                  x = x + self_attn(rms1(x), rotary(pos));  x = x + down(silu(gate(rms2 x)) * up(rms2 x))
    hidden = rms_f(x);  logits = hidden @ head^T                   head: the embedding (tied) or its own matrix

Every gate starts at 0 (tanh(0) = 0), so before training the decoder computes exactly the language model.
Self-attention is the one `Attention` with rotary positions and grouped-query attention; the caches hold the
rotated keys, so a cached decode step only needs its own position's cos/sin.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from ..config import ModelConfig
from .attention import Attention, ImageRoute, gather_rows


def inverse_frequencies(head_dim: int, theta: float, scaling: tuple | None) -> torch.Tensor:
    """The rotary frequencies [Dh/2] (float32, as transformers computes them), with Llama 3's scaling
    (factor, low_freq_factor, high_freq_factor, original context): long wavelengths slowed by `factor`,
    short ones kept, those between interpolated."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv
    factor, low, high, context = scaling
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > context / low, inv / factor, inv)
    smooth = (context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= context / high) & (wavelen <= context / low)
    return torch.where(medium, smoothed, scaled)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)), gate and up in one matmul (Shazeer 2020)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)  # [B, T, 2 Hd] -> 2 x [B, T, Hd]
        return self.down(F.silu(gate) * up)


def mlp_width(cfg: ModelConfig) -> int:
    """The SwiGLU's hidden width (intermediate_size): dec_mlp_ratio x dec_width."""
    return round(cfg.dec_width * cfg.dec_mlp_ratio)


class LlamaBlock(nn.Module):
    """One language model layer: pre-RMSNorm self-attention with rotary positions, then SwiGLU."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, eps = cfg.dec_width, cfg.dec_norm_eps
        self.ln1 = nn.RMSNorm(d, eps=eps)
        self.self_attn = Attention(d, cfg.dec_heads, dropout=cfg.dec_dropout, qk_norm=cfg.dec_qk_norm,
                                   kv_heads=cfg.kv_heads, head_dim=cfg.head_dim, bias=cfg.dec_qkv_bias,
                                   out_bias=False, rms_eps=eps)
        self.ln2 = nn.RMSNorm(d, eps=eps)
        self.mlp = SwiGLU(d, mlp_width(cfg))

    def forward(self, x, rotary, mask=None, cache=None):
        h, _ = self.self_attn(self.ln1(x), mask=mask, cache=cache, rotary=rotary)
        x = x + h
        return x + self.mlp(self.ln2(x))


class CrossBlock(nn.Module):
    """A new layer between language model layers: cross-attention to the image tokens and a SwiGLU, each
    behind a tanh gate that starts at 0, so the block adds nothing until training opens it (mllama's)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, eps = cfg.dec_width, cfg.dec_norm_eps
        self.ln1 = nn.RMSNorm(d, eps=eps)
        self.cross_attn = Attention(d, cfg.dec_heads, cross=True, dropout=cfg.dec_dropout, qk_norm=cfg.dec_qk_norm,
                                    kv_heads=cfg.kv_heads, head_dim=cfg.head_dim, bias=False, out_bias=False,
                                    rms_eps=eps)
        self.ln2 = nn.RMSNorm(d, eps=eps)
        self.mlp = SwiGLU(d, mlp_width(cfg))
        self.attn_gate = nn.Parameter(torch.zeros(1))
        self.mlp_gate = nn.Parameter(torch.zeros(1))

    def forward(self, x, memory_kv, need_weights=False, route=None, probe=None):
        xn = self.ln1(x)
        h, weights = self.cross_attn(xn, kv=memory_kv, need_weights=need_weights, route=route)
        if probe is not None:  # the probed tokens' weights [M, H, Lg, N] (TextDecoder's DecoderBlock says more)
            chosen = gather_rows(xn.flatten(0, 1), probe.reshape(-1)).view(*probe.shape, -1)  # [M, Lg, D]
            weights = self.cross_attn.weights_at(chosen, memory_kv[0])
        x = x + self.attn_gate.tanh() * h
        return x + self.mlp_gate.tanh() * self.mlp(self.ln2(x)), weights


class LlamaDecoder(nn.Module):
    """The llama layout's decoder, with TextDecoder's interface (`memory_kv`, `forward`, `logits`)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dec_width)
        nn.init.normal_(self.embed.weight, std=cfg.dec_width**-0.5)
        self.blocks = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg.dec_depth))
        self.grad_checkpointing = False  # training recomputes each block in the backward pass instead of storing it
        self.cross = nn.ModuleList(CrossBlock(cfg) for _ in range(0, cfg.dec_depth, cfg.dec_cross_every))
        self.ln_f = nn.RMSNorm(cfg.dec_width, eps=cfg.dec_norm_eps)
        # an untied head is a plain matrix [V, D], not an nn.Linear: int8 leaves it in float, as the tied one
        self.head = None if cfg.dec_tie_head else nn.Parameter(
            torch.randn(cfg.vocab_size, cfg.dec_width) * cfg.dec_width**-0.5)
        inv = inverse_frequencies(cfg.head_dim, cfg.dec_rope_theta, cfg.dec_rope_scaling)
        angles = torch.arange(cfg.dec_max_len, dtype=torch.float32)[:, None] * inv  # [L, Dh/2]
        angles = torch.cat((angles, angles), dim=-1)  # [L, Dh]: dimension i and i + Dh/2 turn together
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    @property
    def head_weight(self) -> torch.Tensor:
        """The LM head's matrix [V, D]."""
        return self.embed.weight if self.head is None else self.head

    def memory_kv(self, memory: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each cross-attention block's keys/values of the image tokens, computed once per image."""
        return [blk.cross_attn.project_kv(memory) for blk in self.cross]

    def rotary(self, pos: torch.Tensor | int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B or 1, 1, T, Dh] of positions `pos` ([B, T], or p..p+T-1 in every row)."""
        if isinstance(pos, int):
            if pos < 0 or pos + t > self.cos.shape[0]:
                raise IndexError(f"positions {pos}..{pos + t - 1} are outside 0..{self.cos.shape[0] - 1}")
            return self.cos[None, None, pos : pos + t], self.sin[None, None, pos : pos + t]
        return self.cos[pos][:, None], self.sin[pos][:, None]  # [B, T, Dh] -> [B, 1, T, Dh]

    def forward(self, ids, memory_kv, pos=None, mask=None, caches=None, need_weights=False,
                route: ImageRoute | None = None, probe=None):
        """Hidden states [B, T, D] after the final RMSNorm, and (on request) each cross-attention block's
        weights [B, H, T, N]; the arguments are TextDecoder.forward's."""
        rotary = self.rotary(0 if pos is None else pos, ids.shape[1])
        x = self.embed(ids)
        maps = [] if need_weights or probe is not None else None
        k = self.cfg.dec_cross_every
        recompute = self.grad_checkpointing and self.training and torch.is_grad_enabled()
        for i, blk in enumerate(self.blocks):
            if i % k == 0:
                cross = self.cross[i // k]
                if recompute:
                    x, w = checkpoint(cross, x, memory_kv[i // k], need_weights, route, probe, use_reentrant=False)
                else:
                    x, w = cross(x, memory_kv[i // k], need_weights=need_weights, route=route, probe=probe)
                if maps is not None:
                    maps.append(w)
            cache = None if caches is None else caches[i]
            if recompute:  # the backward pass recomputes the block instead of storing its activations
                x = checkpoint(blk, x, rotary, mask, cache, use_reentrant=False)
            else:
                x = blk(x, rotary, mask=mask, cache=cache)
        return self.ln_f(x), maps

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head: [..., D] -> [..., V]."""
        return hidden @ self.head_weight.t()
