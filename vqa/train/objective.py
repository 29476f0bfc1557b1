"""The training objective as a module, so DDP and torch.compile wrap exactly what a step runs.

For a batch of M images and its text rows it returns the *sum* of every target token's cross-entropy, each
weighted by its task's weight; the trainer divides by the global weighted target count. The images are
encoded once and every layer's cross-attention keys/values computed once. Training's layout is packed
(`vqa.data.collate.PackedRows`: rows of questions and captions end to end, each a causal segment): one decoder
pass reads each image's keys/values in place, where rows mix images through an image-major cross-attention
core (`vqa.data.packing`, `ImageRoute`). Task groups (one padded row per question) gather them per row.
Target positions and ids come precomputed from the collate function: no boolean-mask indexing, no
host sync, and no data-dependent control flow for torch.compile to break on.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..data.collate import IGNORE, PackedRows, TaskGroup
from ..model import VQAModel
from ..model.attention import ImageRoute, gather_rows
from ..model.masks import segment_mask


class Objective(nn.Module):
    def __init__(self, model: VQAModel):
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor, groups: list[TaskGroup] | PackedRows,
                weights: list[float]) -> torch.Tensor:
        """`groups`: task groups with one weight each, or packed rows with one weight per task of `tasks`."""
        model = self.model
        kv_all = model.decoder.memory_kv(model.encode(images))  # per layer, 2 x [M, H, N, Dh]
        total = images.new_zeros((), dtype=torch.float32)
        if isinstance(groups, PackedRows):
            p = groups
            route = None if p.image_tokens is None else ImageRoute(p.image_tokens, p.token_slots)
            kv = kv_all if p.image_index is None else [
                (gather_rows(k, p.image_index), gather_rows(v, p.image_index)) for k, v in kv_all]
            hidden, _ = model.decoder(p.input_ids, kv, pos=p.positions, mask=segment_mask(p.segments), route=route)
            logits = model.target_logits(hidden, p.target_pos)  # [K, V]
            ce = F.cross_entropy(logits.float(), p.target_ids, ignore_index=IGNORE, reduction="none")  # [K]
            for i, w in enumerate(weights):  # per task, without indexing by data (no host sync)
                total = total + w * torch.where(p.target_task == i, ce, 0.0).sum()
            return total
        for g, w in zip(groups, weights, strict=True):
            kv = [(gather_rows(k, g.image_index), gather_rows(v, g.image_index)) for k, v in kv_all]
            hidden, _ = model.decoder(g.input_ids, kv)  # [B, T, D]
            logits = model.target_logits(hidden, g.target_pos)  # [K, V]
            ce = F.cross_entropy(logits.float(), g.target_ids, ignore_index=IGNORE, reduction="sum")
            total = total + w * ce
        if not groups:  # every sample of the batch was unusable (a shard's bad records): a zero loss that still
            # reaches every parameter, so backward() works and DDP's ranks stay in step
            total = total + sum(p.sum() for p in self.parameters() if p.requires_grad) * 0.0
        return total


__all__ = ["Objective"]
