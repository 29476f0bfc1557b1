"""The decoder's self-attention mask, defined once: the decode path's prefill (`vqa.decoding.batch.prefill`), the
exported decoder step (`vqa.export.onnx.DecoderStepGraph`) and the written-out attention of the explain path
(`vqa.model.attention`) all build it here, so PyTorch and ONNX cannot drift apart.

Padding is on the left in a batch of prompts of different lengths, so a padding position comes first and has no
real key before it. It still sees its own key: no row of the mask is all False, so no attention kernel meets a
softmax over nothing (NaN in some kernels, 0 in PyTorch's, something else in an exported graph) and padding
positions compute the same finite numbers everywhere. A real position never sees a padding key, so what padding
positions compute never reaches a real one.
"""

from __future__ import annotations

import torch


def causal_mask(queries: int, keys: int, device=None, key_valid: torch.Tensor | None = None) -> torch.Tensor:
    """bool [B or 1, 1, T, S], True = may attend, for T = `queries` queries that are the last T of S = `keys`
    positions (the first S - T are cached): query i sees keys 0..S - T + i that are real (`key_valid` [B, S];
    None: every key), and always its own key (S - T + i)."""
    cols = torch.arange(keys, device=device)
    rows = torch.arange(queries, device=device) + (keys - queries)  # each query's own position
    causal = cols[None, :] <= rows[:, None]  # [T, S]
    if key_valid is None:
        return causal[None, None]
    return ((causal & key_valid[:, None, :]) | (cols[None, :] == rows[:, None]))[:, None]


__all__ = ["causal_mask"]
