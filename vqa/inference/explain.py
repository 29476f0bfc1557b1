"""The attention explorer's numbers: every attention weight (and raw score) behind one answer or caption,
read from the model's own attention modules on a separate pass, so answering stays on the fused kernels.

    e = predictor.explain("photo.png", "what color is the circle?")   # answers, then explains the answer
    e.self_weights      # [L, H, T, T] the decoder's masked self-attention over prompt + generated tokens
    e.cross_weights     # [Lc, H, T, N] each token's cross-attention over the N image tokens (prefix first)
    e.cross_scores      # [Lc, H, T, N] the same before the softmax: q.k / sqrt(d_head)
    e.vit_weights       # [Lv, Hv, Nv, Nv] the ViT's self-attention over its own tokens (prefix first)
    e.save("out/")      # attention.npz and the explorer's pictures as PNG

Rows are queries, columns keys. Position t of the decoder reads token t and predicts token t + 1, so the
query that *wrote* generated token i sits at position P - 1 + i (P = prompt length): `query_position(i)`.
That is the query behind the app's per-word heatmaps, and `cross_maps()` is exactly `Answer.attention`.

How the numbers are read. The decoder's `Attention` modules take a `capture` list: while it is set, a module
computes softmax(Q K^T / sqrt(d) + mask) written out (`vqa.model.attention._attention_with_weights`) and
appends the weights and the raw scores. timm's ViT attention has a `fused_attn` switch: turned off for this
one call, its softmaxed weights pass through `attn_drop` (the identity in eval mode), where a forward hook
reads them. Both are restored before the call returns; the caller holds the Predictor's lock, so no
concurrent answer runs on the unfused path or lands in the records.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import InputError
from ..model.attention import Attention, AttentionRecord

NPZ = "attention.npz"


@dataclass
class Explanation:
    tokens: list[str]  # [T] the decoder's input: the prompt's tokens, then the generated ones (readable text)
    prompt_len: int  # P: tokens[:P] are the prompt
    self_weights: np.ndarray  # [L, H, T, T] masked self-attention after the softmax (0 above the diagonal)
    self_scores: np.ndarray  # [L, H, T, T] its raw scaled scores q.k / sqrt(d); -inf above the diagonal
    cross_weights: np.ndarray  # [Lc, H, T, N] cross-attention over the memory (prefix tokens first); Lc < L
    cross_scores: np.ndarray  # [Lc, H, T, N] its raw scaled scores       in the llama layout (cross_layer_ids)
    vit_weights: np.ndarray  # [Lv, Hv, Nv, Nv] the ViT's self-attention (prefix tokens first); [0] if unread
    grid: int  # patches per side
    memory_prefix: int  # memory tokens before the patches (the CLS / register tokens)
    vit_prefix: int  # ViT tokens before the patches
    image_size: int  # the letterboxed square the model saw, in pixels
    text: str = ""  # the answer or caption explained
    question: str | None = None
    image: object = field(default=None, repr=False)  # the picture as given (RGB PIL image), for drawing
    resize: str = "letterbox"  # how the picture became the square (ModelConfig.vit_resize)
    cross_layer_ids: tuple = ()  # the decoder layer (0-based) of each cross-attention layer; () : the same index

    def cross_layer_number(self, j: int) -> int:
        """The decoder layer, counted from 1, of cross-attention layer j (0-based): the llama layout has fewer
        cross-attention layers than layers, each before a layer of the language model."""
        return (self.cross_layer_ids[j] if self.cross_layer_ids else j) + 1

    @property
    def generated(self) -> list[str]:
        return self.tokens[self.prompt_len :]

    def query_position(self, i: int) -> int:
        """The decoder position whose query wrote generated token i (0-based)."""
        g = len(self.generated)
        if not 0 <= i < g:
            raise InputError(f"generated token {i} does not exist: there are {g} (0-based)")
        return self.prompt_len - 1 + i

    def _patches(self, a: np.ndarray, prefix: int) -> np.ndarray:
        """[..., prefix + grid^2] -> [..., grid, grid]."""
        return a[..., prefix:].reshape(*a.shape[:-1], self.grid, self.grid)

    def cross_maps(self) -> np.ndarray:
        """[G, L, H, grid, grid]: the cross-attention over the patches behind each generated token (prefix
        dropped: a map sums to at most 1), the arrays `Answer.attention` holds."""
        rows = self.cross_weights[:, :, self.prompt_len - 1 : len(self.tokens) - 1]  # [L, H, G, N]
        return self._patches(rows, self.memory_prefix).transpose(2, 0, 1, 3, 4)

    def query_against_keys(self, i: int, layer: int, head: int) -> tuple[np.ndarray, np.ndarray]:
        """Generated token i's query against every image key in one layer and head: the raw scores
        q.k / sqrt(d) and the weights after the softmax, both [N] (prefix keys first)."""
        t = self.query_position(i)
        return self.cross_scores[layer, head, t], self.cross_weights[layer, head, t]

    def vit_patch_attention(self, row: int, col: int) -> np.ndarray:
        """[Lv, Hv, grid, grid]: where patch (row, col)'s query looks among the patches, in every ViT layer
        and head (prefix keys dropped)."""
        if not (0 <= row < self.grid and 0 <= col < self.grid):
            raise InputError(f"patch ({row}, {col}) is outside the {self.grid}x{self.grid} grid")
        if self.vit_weights.ndim != 4:
            raise InputError("the ViT's attention could not be read for this model")
        q = self.vit_prefix + row * self.grid + col
        return self._patches(self.vit_weights[:, :, q], self.vit_prefix)

    def arrays(self) -> dict[str, np.ndarray]:
        """Everything as named arrays (the .npz export)."""
        return dict(tokens=np.asarray(self.tokens), prompt_len=np.asarray(self.prompt_len),
                    self_weights=self.self_weights, self_scores=self.self_scores,
                    cross_weights=self.cross_weights, cross_scores=self.cross_scores,
                    cross_maps=self.cross_maps(), vit_weights=self.vit_weights, grid=np.asarray(self.grid),
                    memory_prefix=np.asarray(self.memory_prefix), vit_prefix=np.asarray(self.vit_prefix),
                    image_size=np.asarray(self.image_size), text=np.asarray(self.text),
                    cross_layer_ids=np.asarray([self.cross_layer_number(j) - 1
                                                for j in range(len(self.cross_weights))]))

    def save(self, folder: str | Path, pictures: bool = True, **which) -> list[Path]:
        """Write `attention.npz` (every array) and, with `pictures`, the explorer's figures as PNG files into
        `folder`; returns the files written. `which`: `vqa.inference.figures.save_figures`'s choice of tokens,
        layer, head and patch."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(folder / NPZ, **self.arrays())
        out = [folder / NPZ]
        if pictures:
            from .figures import save_figures

            out += save_figures(self, folder, **which)
        return out


# ------------------------------------------------------------------------------------------- reading them


@contextlib.contextmanager
def decoder_capture(decoder: nn.Module) -> Iterator[tuple[list[list[AttentionRecord]], list[list[AttentionRecord]]]]:
    """While active, every decoder layer's self- and cross-attention record their weights and raw scores:
    yields (self records, cross records), one list per layer."""
    # the llama layout's cross-attention sits in blocks of its own (`decoder.cross`), fewer than the layers
    attns = ([blk.self_attn for blk in decoder.blocks],
             [blk.cross_attn for blk in getattr(decoder, "cross", decoder.blocks)])
    selfs, crosses = ([[] for _ in layers] for layers in attns)
    for layers, records in zip(attns, (selfs, crosses), strict=True):
        for attn, r in zip(layers, records, strict=True):
            attn.capture = r
    try:
        yield selfs, crosses
    finally:
        for attn in (*attns[0], *attns[1]):
            attn.capture = None


@contextlib.contextmanager
def vit_capture(vit: nn.Module) -> Iterator[list[torch.Tensor]]:
    """While active, timm's attention layers run unfused and each appends its softmaxed weights
    [B, H, N, N] (read at `attn_drop`, the identity in eval mode) to the yielded list, in layer order."""
    layers = [m for m in vit.modules()
              if hasattr(m, "fused_attn") and isinstance(getattr(m, "attn_drop", None), nn.Module)
              and not isinstance(m, Attention)]
    records: list[torch.Tensor] = []
    saved = [m.fused_attn for m in layers]
    hooks = [m.attn_drop.register_forward_hook(lambda _m, _i, out: records.append(out.detach())) for m in layers]
    for m in layers:
        m.fused_attn = False
    try:
        yield records
    finally:
        for m, f in zip(layers, saved, strict=True):
            m.fused_attn = f
        for h in hooks:
            h.remove()


@torch.no_grad()
def explain_tokens(model, image: torch.Tensor, prompt: list[int], generated: list[int]) -> dict[str, np.ndarray]:
    """The attention arrays of one teacher-forced pass over prompt + generated for one normalized image
    [1, 3, S, S] (the arrays of `Explanation`, without the text)."""
    cfg = model.cfg
    ids = list(prompt) + list(generated)
    if not prompt:
        raise InputError("the prompt needs at least one token (<bos>)")
    if len(ids) > cfg.dec_max_len:
        raise InputError(f"prompt + generated of {len(ids)} tokens exceeds dec_max_len={cfg.dec_max_len}")
    with vit_capture(model.vision.vit) as vit_records:
        memory = model.encode(image)  # [1, N, D]
    x = torch.as_tensor([ids], dtype=torch.long, device=memory.device)
    with decoder_capture(model.decoder) as (selfs, crosses):
        model.decoder(x, model.memory_kv(memory))

    def stack(records: list[list[AttentionRecord]], part: str) -> np.ndarray:
        # one record per layer; [1, H, T, S] each -> [L, H, T, S]
        return torch.stack([getattr(r[0], part)[0] for r in records]).float().cpu().numpy()

    vit = (torch.stack([r[0] for r in vit_records]).float().cpu().numpy() if vit_records
           else np.zeros((0,), dtype=np.float32))  # [Lv, Hv, Nv, Nv]
    return dict(self_weights=stack(selfs, "weights"), self_scores=stack(selfs, "scores"),
                cross_weights=stack(crosses, "weights"), cross_scores=stack(crosses, "scores"), vit_weights=vit)


__all__ = ["Explanation", "explain_tokens", "decoder_capture", "vit_capture", "NPZ"]
