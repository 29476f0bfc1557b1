"""The joined model: ViT image tokens are the keys/values of every decoder layer's cross-attention."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..errors import InputError
from .attention import gather_rows
from .decoder import TextDecoder
from .vision import VisionEncoder


@dataclass
class Output:
    loss: torch.Tensor | None  # mean cross-entropy over the target tokens
    logits: torch.Tensor | None  # [B, T, V] (None when only the loss was asked for)
    n_targets: float  # how many target tokens the loss averages over (weighted, with group_weights)


class VQAModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.vision = VisionEncoder(cfg)
        self.decoder = TextDecoder(cfg)

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """[M, 3, S, S] -> memory [M, N, D]."""
        return self.vision(images)

    def memory_kv(self, memory: torch.Tensor, image_index: torch.Tensor | None = None):
        """Per-layer cross-attention keys/values; `image_index` [B] picks each text row's image."""
        kv = self.decoder.memory_kv(memory)
        if image_index is not None:
            kv = [(gather_rows(k, image_index), gather_rows(v, image_index)) for k, v in kv]
        return kv

    def forward(
        self,
        images: torch.Tensor,  # [M, 3, S, S]
        input_ids: torch.Tensor | list[torch.Tensor],  # [B, T] prompt + target, right-padded
        loss_mask: torch.Tensor | list[torch.Tensor] | None = None,  # bool [B, T]: True on target tokens
        image_index: torch.Tensor | list[torch.Tensor] | None = None,  # [B] row -> image; default row b -> b
        return_logits: bool = True,
        group_weights: list[float] | None = None,  # a weight for each group's target tokens (default 1)
    ) -> Output:
        """Teacher-forced pass. The logits at position t predict token t+1, so the loss compares
        logits[:, :-1] with input_ids[:, 1:] wherever loss_mask[:, 1:] is set: prompt and padding never count.
        Padding is on the right, so plain causal attention never lets a real token see it.

        `input_ids`, `loss_mask` and `image_index` may also be lists (groups of rows padded separately, e.g.
        short VQA rows and long caption rows): the images are encoded once for all groups, and the loss is
        the mean over every group's target tokens (weighted by `group_weights`: e.g. a caption's 20 tokens need
        not outweigh an answer's 2). Logits are then returned per group, as a list."""
        if torch.is_tensor(input_ids):
            out = self.forward(images, [input_ids], None if loss_mask is None else [loss_mask],
                               None if image_index is None else [image_index], return_logits)
            return Output(out.loss, out.logits[0] if return_logits else None, out.n_targets)
        kv_all = self.decoder.memory_kv(self.encode(images))  # per layer, 2 x [M, H, N, Dh]
        loss_sum, n, logits = None, 0, []
        for g, ids in enumerate(input_ids):
            if ids.ndim != 2 or ids.shape[1] < 1:
                raise InputError(f"input_ids must be [B, T] with T >= 1, got {tuple(ids.shape)}")
            if ids.shape[1] > self.cfg.dec_max_len:
                raise InputError(f"sequence of {ids.shape[1]} tokens is longer than dec_max_len={self.cfg.dec_max_len}")
            index = None if image_index is None else image_index[g]
            if index is None and images.shape[0] != ids.shape[0]:
                raise InputError(f"{images.shape[0]} images for {ids.shape[0]} text rows and no image_index")
            kv = kv_all if index is None else [(gather_rows(k, index), gather_rows(v, index)) for k, v in kv_all]
            hidden, _ = self.decoder(ids, kv)  # [B, T, D]
            if loss_mask is not None:
                select = loss_mask[g][:, 1:]  # [B, T-1]: is the next token a target?
                w = 1.0 if group_weights is None else float(group_weights[g])
                n += w * int(select.sum())
                # the LM head only where a target is predicted: a VQA answer is a few tokens of a long prompt
                pred = self.decoder.logits(hidden[:, :-1][select])  # [K, V]
                part = w * F.cross_entropy(pred.float(), ids[:, 1:][select], reduction="sum")
                loss_sum = part if loss_sum is None else loss_sum + part
            if return_logits:
                logits.append(self.decoder.logits(hidden))
        loss = None if loss_mask is None else loss_sum / max(n, 1)
        return Output(loss=loss, logits=logits if return_logits else None, n_targets=n)

    def num_parameters(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)
