"""The training objective as a module, so DDP and torch.compile wrap exactly what a step runs.

For a batch of M images and its task groups it returns the *sum* of every target token's cross-entropy,
each weighted by its task's weight; the trainer divides by the global weighted target count. The images
are encoded once and every layer's cross-attention keys/values computed once, then gathered for each text
row. Target positions and ids come precomputed from the collate function: no boolean-mask indexing, no
host sync, and no data-dependent control flow for torch.compile to break on.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..data.collate import IGNORE, TaskGroup
from ..model import VQAModel
from ..model.attention import gather_rows


class Objective(nn.Module):
    def __init__(self, model: VQAModel):
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor, groups: list[TaskGroup], weights: list[float]) -> torch.Tensor:
        model = self.model
        kv_all = model.decoder.memory_kv(model.encode(images))  # per layer, 2 x [M, H, N, Dh]
        total = images.new_zeros((), dtype=torch.float32)
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
