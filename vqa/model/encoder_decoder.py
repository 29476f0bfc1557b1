"""The joined model: ViT image tokens are the keys/values of every decoder layer's cross-attention."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..errors import InputError
from .decoder import TextDecoder
from .vision import VisionEncoder


@dataclass
class Output:
    loss: torch.Tensor | None  # mean cross-entropy over the target tokens
    logits: torch.Tensor | None  # [B, T, V] (None when only the loss was asked for)
    n_targets: int  # how many target tokens the loss averages over


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
            kv = [(k.index_select(0, image_index), v.index_select(0, image_index)) for k, v in kv]
        return kv

    def forward(
        self,
        images: torch.Tensor,  # [M, 3, S, S]
        input_ids: torch.Tensor,  # [B, T] prompt + target, right-padded
        loss_mask: torch.Tensor | None = None,  # bool [B, T]: True on target tokens (incl. <eos>)
        image_index: torch.Tensor | None = None,  # [B] row -> image; default row b uses image b
        return_logits: bool = True,
    ) -> Output:
        """Teacher-forced pass. The logits at position t predict token t+1, so the loss compares
        logits[:, :-1] with input_ids[:, 1:] wherever loss_mask[:, 1:] is set: prompt and padding never count.
        Padding is on the right, so plain causal attention never lets a real token see it."""
        if input_ids.ndim != 2 or input_ids.shape[1] < 1:
            raise InputError(f"input_ids must be [B, T] with T >= 1, got {tuple(input_ids.shape)}")
        if input_ids.shape[1] > self.cfg.dec_max_len:
            raise InputError(f"sequence of {input_ids.shape[1]} tokens is longer than dec_max_len={self.cfg.dec_max_len}")
        if image_index is None and images.shape[0] != input_ids.shape[0]:
            raise InputError(f"{images.shape[0]} images for {input_ids.shape[0]} text rows and no image_index")
        hidden, _ = self.decoder(input_ids, self.memory_kv(self.encode(images), image_index))  # [B, T, D]
        loss, n = None, 0
        if loss_mask is not None:
            select = loss_mask[:, 1:]  # [B, T-1]: is the next token a target?
            n = int(select.sum())
            # the LM head only where a target is predicted: a VQA answer is a few tokens of a long prompt
            pred = self.decoder.logits(hidden[:, :-1][select])  # [K, V]
            loss = F.cross_entropy(pred.float(), input_ids[:, 1:][select], reduction="sum") / max(n, 1)
        logits = self.decoder.logits(hidden) if return_logits else None
        return Output(loss=loss, logits=logits, n_targets=n)

    def num_parameters(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)
