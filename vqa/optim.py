"""AdamW with weight decay on matrices only (nanoGPT's rule), a separate learning rate for the vision
encoder, and a linear-warmup-then-cosine schedule."""

from __future__ import annotations

import math

import torch
from torch import nn


def param_groups(model: nn.Module, lr: float, vit_lr: float, weight_decay: float) -> list[dict]:
    """Four groups: {decoder, vision} x {decay (2-D and up), no decay (biases, norms, 1-D)}. Position
    embeddings and the CLS token of the ViT are not decayed either. vit_lr = 0 freezes the encoder."""
    groups = {(v, d): [] for v in (False, True) for d in (False, True)}
    for name, p in model.named_parameters():
        is_vit = name.startswith("vision.vit.")
        if is_vit and vit_lr == 0:
            p.requires_grad_(False)
        if not p.requires_grad:
            continue
        no_decay = p.ndim < 2 or name.endswith(("pos_embed", "cls_token", "reg_token")) or "pos.weight" in name
        groups[(is_vit, not no_decay)].append(p)
    out = []
    for (is_vit, decay), params in groups.items():
        if params:
            out.append(
                dict(params=params, lr=vit_lr if is_vit else lr, base_lr=vit_lr if is_vit else lr,
                     weight_decay=weight_decay if decay else 0.0)
            )
    return out


def make_optimizer(model, lr, vit_lr, weight_decay, fused: bool = False) -> torch.optim.AdamW:
    groups = param_groups(model, lr, vit_lr, weight_decay)
    return torch.optim.AdamW(groups, betas=(0.9, 0.98), eps=1e-8, fused=fused or None)


def lr_factor(step: int, warmup: int, total: int, min_ratio: float = 0.1) -> float:
    """Linear warmup from 0 to 1 over `warmup` steps, then cosine from 1 to `min_ratio` at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def set_lr(optimizer: torch.optim.Optimizer, factor: float) -> float:
    for g in optimizer.param_groups:
        g["lr"] = g["base_lr"] * factor
    return optimizer.param_groups[0]["lr"]
