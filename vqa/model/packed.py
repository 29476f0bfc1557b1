"""What the training forward (`VQAModel.forward`) consumes: a batch's text rows packed end to end into rows
that mix images (`vqa.data.packing.pack` builds them; the model defines them).

A text row is a segment: never split, with its own positions from 0 and a causal mask within itself
(`vqa.model.encoder_decoder.segment_mask`), so it computes what it computes alone. Cross-attention needs each
token's own image: the decoder keeps its projections in the packed layout and runs only the attention core
image-major (`vqa.model.attention.ImageRoute`): `image_tokens` [M, L] gathers image m's tokens (its queries)
from the flat [R * T] tokens, attention runs against image m's keys/values [M, H, N, Dh] as the ViT computed
them (no copy per row), and `token_slots` [R * T] puts each output back.

Every count and index the forward needs about its targets comes with the rows, computed on the CPU, so the
training step never waits for the device to report one.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

IGNORE = -100  # cross_entropy's ignore_index: a padding target


@dataclass
class PackedRows:
    """A training batch's text rows packed across images. Tensors are [R, T] / [K] / [M, L]; R, T, K, L as
    padded. Padding tokens are segment 0 (they attend to padding only); padding targets have id IGNORE and
    weight 0."""

    input_ids: torch.Tensor  # [R, T] long
    positions: torch.Tensor  # [R, T] long: each token's position in its segment (0 on padding)
    segments: torch.Tensor  # [R, T] long: 1, 2, ... the segment of each token; 0 on padding
    target_pos: torch.Tensor  # [K] long: flat positions in [R * (T-1)] whose next token is a target
    target_ids: torch.Tensor  # [K] long: those targets (IGNORE for padding)
    target_weight: torch.Tensor  # [K] float: each target's task weight (0 for padding)
    image_tokens: torch.Tensor  # [M, L] long: image m's tokens as flat positions in [R * T] (padded)
    token_slots: torch.Tensor  # [R * T] long: each token's place in [M * L] (padding: any)
    weighted_targets: float  # target_weight's sum: what the step divides the summed loss by
    # grounded tokens (`vqa.data.regions`; None when training has no grounding loss), image-major: image m's
    # Lg (padded, at least 1) grounded tokens, read against its own keys as the cross-attention core reads them
    ground_tokens: torch.Tensor | None = None  # [M, Lg] long: flat positions in [R * T] (padding: any)
    ground_target: torch.Tensor | None = None  # [M, Lg, P] float: where its object is, over the P patches
    ground_weight: torch.Tensor | None = None  # [M, Lg] float: the grounding loss's weight (0 on padding)

    def to(self, device, non_blocking: bool = False) -> PackedRows:
        return PackedRows(**{f.name: (v.to(device, non_blocking=non_blocking) if torch.is_tensor(v) else v)
                             for f in fields(self) for v in [getattr(self, f.name)]})

    def pin_memory(self) -> PackedRows:
        return PackedRows(**{f.name: (v.pin_memory() if torch.is_tensor(v) else v)
                             for f in fields(self) for v in [getattr(self, f.name)]})

    @property
    def real_tokens(self) -> int:
        return int((self.segments > 0).sum())


__all__ = ["IGNORE", "PackedRows"]
