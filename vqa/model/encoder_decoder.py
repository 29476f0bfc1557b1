"""The joined model: ViT image tokens are the keys/values of every decoder layer's cross-attention."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..errors import InputError
from .attention import ImageRoute, gather_rows
from .decoder import TextDecoder
from .llama_decoder import LlamaDecoder
from .packed import IGNORE, PackedRows
from .vision import VisionEncoder


@dataclass
class Output:
    """What `VQAModel.teacher_forced` returns."""

    loss: torch.Tensor | None  # mean cross-entropy over the target tokens
    logits: torch.Tensor | None  # [B, T, V] (None when only the loss was asked for)
    n_targets: int  # how many target tokens the loss averages over


def target_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """Flat indices into [B * (T-1)] of the positions whose *next* token is a target: the logits at
    position t predict token t+1. [K] (a host sync; the training data path computes these in collate)."""
    return loss_mask[:, 1:].reshape(-1).nonzero().squeeze(1)


def target_loss(logits: torch.Tensor, target_ids: torch.Tensor, reduction: str = "none") -> torch.Tensor:
    """The model's loss, defined once: the cross-entropy of logits [K, V] against target_ids [K], in float32
    whatever the autocast; IGNORE targets count 0. `reduction`: "none" [K], or "sum"."""
    return F.cross_entropy(logits.float(), target_ids, ignore_index=IGNORE, reduction=reduction)


def grounding_loss(maps: list[torch.Tensor], target: torch.Tensor) -> torch.Tensor:
    """[M, Lg]: KL(target || attention) of grounded tokens, the attention being the mean over layers and heads
    of the cross-attention weights (`maps`: per layer [M, H, Lg, N], N = prefix tokens + patches) over the
    patches, the map `vqa eval --pointing` and the demo show; target [M, Lg, P] over the P patches, summing to
    1 (0 on padding). Mass on the prefix tokens counts as mass outside the object."""
    attn = torch.stack(maps).float().mean((0, 2))[..., -target.shape[-1]:]  # [L, M, H, Lg, N] -> [M, Lg, P]
    return (torch.xlogy(target, target) - target * attn.clamp_min(1e-8).log()).sum(-1)


def segment_mask(segments: torch.Tensor) -> torch.Tensor:
    """bool [B, 1, T, T], True = may attend, for packed rows (`segments` [B, T]: 1, 2, ... the segment of each
    token, 0 on padding): each position sees the earlier positions of its own segment and itself, so a segment
    computes what it computes alone. Padding sees padding only, and always its own key."""
    t = segments.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=segments.device).tril()  # [T, T]
    return ((segments[:, :, None] == segments[:, None, :]) & causal)[:, None]


class VQAModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        """The decoder's weights are random, also where `cfg.dec_pretrained` names a language model:
        `vqa.weights.language_model.build_model` copies those in, `vqa.weights.model_files.load` a saved model's."""
        super().__init__()
        self.cfg = cfg
        self.vision = VisionEncoder(cfg)
        layout = LlamaDecoder if cfg.dec_layout == "llama" else TextDecoder
        self.decoder = layout(cfg)

    # ---- the parts ----
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """[M, 3, S, S] -> memory [M, N, D]."""
        return self.vision(images)

    def memory_kv(self, memory: torch.Tensor, image_index: torch.Tensor | None = None):
        """Per-layer cross-attention keys/values 2 x [B, H, N, Dh]; `image_index` [B] picks each text row's
        image (one encoding serves every question about it)."""
        kv = self.decoder.memory_kv(memory)
        if image_index is not None:
            kv = [(gather_rows(k, image_index), gather_rows(v, image_index)) for k, v in kv]
        return kv

    def target_logits(self, hidden: torch.Tensor, target_pos: torch.Tensor) -> torch.Tensor:
        """The LM head at the target positions only: hidden [B, T, D] -> logits [K, V]. A VQA answer is a
        few tokens of a long prompt, so this is a fraction of the full head's work."""
        flat = hidden[:, :-1].reshape(-1, hidden.shape[-1])  # [B*(T-1), D]
        return self.decoder.logits(flat.index_select(0, target_pos))

    def check_text(self, ids: torch.Tensor, images: torch.Tensor, image_index: torch.Tensor | None) -> None:
        if ids.ndim != 2 or ids.shape[1] < 1:
            raise InputError(f"input_ids must be [B, T] with T >= 1, got {tuple(ids.shape)}")
        if ids.shape[1] > self.cfg.dec_max_len:
            raise InputError(f"sequence of {ids.shape[1]} tokens is longer than dec_max_len={self.cfg.dec_max_len}")
        if image_index is None and images.shape[0] != ids.shape[0]:
            raise InputError(f"{images.shape[0]} images for {ids.shape[0]} text rows and no image_index")

    # ---- training ----
    def forward(self, images: torch.Tensor, rows: PackedRows,
                return_logits: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Training's pass: the sum over every target token of a batch of its cross-entropy times its task's
        weight (the step divides by the global sum of the weights, `rows.weighted_targets` over micro-batches
        and ranks); with `return_logits`, (loss, the target positions' logits [K, V]). The whole trip, from
        the loader's batch:

        1. `images` [M, 3, S, S] -> the ViT (`vqa.model.vision`) -> memory [M, N, D] -> each decoder layer's
           cross-attention keys/values 2 x [M, H, N, Dh], once per image however many rows read it.
        2. `rows` (`vqa.model.packed.PackedRows`, built by `vqa.data.packing.pack`): every question and
           caption of the batch end to end in [R, T] rows that mix images, each a segment with its own
           positions from 0 that attends causally within itself only (`segment_mask`). Self-attention and the
           projections run in that layout; the cross-attention core runs image-major (`ImageRoute`: image
           m's tokens [M, L] against image m's keys/values), each token reading its own image's patches only.
        3. With grounded tokens (`rows.ground_pos`, `vqa.data.regions`): their cross-attention, every layer's
           and head's mean, against where their object is (`grounding_loss`), times `rows.ground_weight`.
        4. The LM head at the target positions only (`rows.target_pos` [K]), `target_loss` against
           `rows.target_ids` [K], times `rows.target_weight` [K] (0 on padding targets), summed.

        No host sync and no data-dependent control flow (torch.compile, DDP's static graph): every count and
        index comes from the collate function. A batch without any text row is one padding row and one
        padding target: a zero loss whose graph still reaches every parameter."""
        kv = self.decoder.memory_kv(self.encode(images))  # per layer, 2 x [M, H, N, Dh]
        route = ImageRoute(rows.image_tokens, rows.token_slots)
        probe = rows.ground_tokens  # [M, Lg] or None
        hidden, maps = self.decoder(rows.input_ids, kv, pos=rows.positions, mask=segment_mask(rows.segments),
                                    route=route, probe=probe)  # [R, T, D]
        logits = self.target_logits(hidden, rows.target_pos)  # [K, V]
        loss = (target_loss(logits, rows.target_ids) * rows.target_weight).sum()
        if probe is not None:
            loss = loss + (grounding_loss(maps, rows.ground_target) * rows.ground_weight).sum()
        return (loss, logits) if return_logits else loss

    # ---- teacher forcing ----
    def teacher_forced(
        self,
        images: torch.Tensor,  # [M, 3, S, S]
        input_ids: torch.Tensor,  # [B, T] prompt + target, right-padded
        loss_mask: torch.Tensor | None = None,  # bool [B, T]: True on target tokens
        image_index: torch.Tensor | None = None,  # [B] row -> image; default row b -> image b
        return_logits: bool = True,
    ) -> Output:
        """One pass over whole right-padded rows, every position's logits: what the tests compare (with the
        exported and imported models' logits too). The logits at position t predict token t+1, so the loss
        (the mean of `target_loss`) compares logits[:, :-1] with input_ids[:, 1:] wherever loss_mask[:, 1:] is
        set: prompt and padding never count. Padding is on the right, so plain causal attention never lets a
        real token see it. (It counts its targets on the host; training calls `forward`, which needs no host
        sync.)"""
        self.check_text(input_ids, images, image_index)
        hidden, _ = self.decoder(input_ids, self.memory_kv(self.encode(images), image_index))  # [B, T, D]
        loss, n = None, 0
        if loss_mask is not None:
            target_pos = target_positions(loss_mask)
            n = int(target_pos.numel())
            labels = input_ids[:, 1:].reshape(-1).index_select(0, target_pos)
            loss = target_loss(self.target_logits(hidden, target_pos), labels, reduction="sum") / max(n, 1)
        return Output(loss=loss, logits=self.decoder.logits(hidden) if return_logits else None, n_targets=n)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Activation checkpointing of every decoder block and ViT block (timm's own): the backward pass
        recomputes each block's activations, so training stores one tensor per block instead of all of them."""
        self.decoder.grad_checkpointing = enable
        self.vision.vit.set_grad_checkpointing(enable)

    def num_parameters(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)
