"""The named presets: each is a model (ModelConfig fields) and the training defaults it was tuned with."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError
from .base import check_fields
from .model import ModelConfig


@dataclass(frozen=True)
class Preset:
    """A named starting point: the model's fields and the training defaults that suit it. `lr` and
    `optimizer` have no default on purpose: every preset says what it was tuned with."""

    model: dict
    lr: float
    optimizer: str
    train: dict = field(default_factory=dict)  # any other TrainConfig field, e.g. vit_lr_scale
    about: str = ""


# the decoder layout of GPT-2 (learned positions, tanh GELU, no embedding scale, no QK-norm)
GPT2_DECODER = dict(dec_positions="learned", dec_activation="gelu_tanh", dec_embed_scale=False, dec_qk_norm=False)

# the decoder layout of Llama / SmolLM2 (RMSNorm, rotary positions, SwiGLU, a tied head; vqa.model.llama_decoder)
LLAMA_DECODER = dict(dec_layout="llama", dec_positions="rotary", dec_activation="silu", dec_embed_scale=False,
                     dec_qk_norm=False, dec_tie_head=True)

PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        about="trains on 2 CPU cores in minutes: a narrow 3-layer ViT on 64 px images "
              "with a conv stem down to 8 px patches, a 3-layer decoder, QK-norm everywhere, fixed 2-D "
              "positions on the memory",
        model=dict(
            vit_name="vit_tiny_patch16_224", vit_image_size=64, vit_patch_size=8,
            vit_width=96, vit_depth=3, vit_heads=2, vit_conv_stem=True, vit_qk_norm=True, vit_memory_pos=True,
            dec_width=96, dec_depth=3, dec_heads=3, dec_max_len=48, dec_qk_norm=True,
        ),
        # a from-scratch encoder that moves more slowly than the decoder lets the cross-attention settle
        # sooner; Muon learns the from-scratch model in far fewer steps; a second caption of each image a step
        # shows the listing captions that teach position twice as often, for ~20% more decoder tokens
        lr=1e-3, optimizer="muon", train=dict(vit_lr_scale=0.3, captions_per_image=2),
    ),
    "small": Preset(
        about="ViT-S/16 at 224 px + a 6-layer decoder (GPU); timm's layout, so pretrained weights load",
        model=dict(vit_name="vit_small_patch16_224", vit_patch_size=16, dec_width=384, dec_depth=6, dec_heads=6,
                   dec_max_len=64),
        lr=3e-4, optimizer="adamw",
    ),
    "base": Preset(
        about="ViT-B/16 at 224 px + an 8-layer decoder (GPU); timm's layout, so pretrained weights load",
        model=dict(vit_name="vit_base_patch16_224", vit_patch_size=16, dec_width=768, dec_depth=8, dec_heads=12,
                   dec_max_len=64),
        lr=1e-4, optimizer="adamw",
    ),
    # Pretrained towers (docs/pretrained.md): timm's ImageNet-21k ViT and a GPT-2 from the Hugging Face Hub,
    # joined by new cross-attention layers that start at zero contribution. The decoder fields repeat the
    # language model's config.json (it overrides them anyway), so dec_pretrained=None builds the same shapes.
    # Three learning rates: --lr for the new layers, x dec_lr_scale for the pretrained decoder, x vit_lr_scale
    # for the pretrained encoder (starting points from the fine-tuning literature, not tuned here).
    "small-gpt2": Preset(
        about="ViT-S/16 (timm's weights) + DistilGPT-2 (6 layers, 768 wide, distilbert/distilgpt2) joined by new "
              "cross-attention (GPU; downloads both)",
        model=dict(vit_name="vit_small_patch16_224", vit_patch_size=16, vit_pretrained=True,
                   dec_pretrained="distilbert/distilgpt2", dec_max_len=64, **GPT2_DECODER,
                   dec_width=768, dec_depth=6, dec_heads=12),
        lr=1e-4, optimizer="adamw", train=dict(dec_lr_scale=0.2, vit_lr_scale=0.1),
    ),
    "base-gpt2": Preset(
        about="ViT-B/16 (timm's weights) + GPT-2 (12 layers, 768 wide, openai-community/gpt2) joined by new "
              "cross-attention (GPU; downloads both)",
        model=dict(vit_name="vit_base_patch16_224", vit_patch_size=16, vit_pretrained=True,
                   dec_pretrained="openai-community/gpt2", dec_max_len=64, **GPT2_DECODER,
                   dec_width=768, dec_depth=12, dec_heads=12),
        lr=1e-4, optimizer="adamw", train=dict(dec_lr_scale=0.2, vit_lr_scale=0.1),
    ),
    # Llama-layout language models (vqa.model.llama_decoder): gated cross-attention blocks before every
    # dec_cross_every-th layer, as mllama's one in five; the language model moves at a tenth of the new blocks'
    # rate, as the *-gpt2 presets' decoder (starting points, not tuned here)
    "small-smollm2": Preset(
        about="ViT-S/16 (timm's weights) + SmolLM2-135M (30 layers, 576 wide, HuggingFaceTB/SmolLM2-135M, or its "
              "folder with --set dec_pretrained=DIR) with a gated cross-attention block every 3 layers (GPU)",
        model=dict(vit_name="vit_small_patch16_224", vit_patch_size=16, vit_pretrained=True,
                   dec_pretrained="HuggingFaceTB/SmolLM2-135M", dec_max_len=64, **LLAMA_DECODER,
                   dec_width=576, dec_depth=30, dec_heads=9, dec_kv_heads=3, dec_mlp_ratio=1536 / 576,
                   dec_rope_theta=100000.0, dec_cross_every=3),
        lr=1e-4, optimizer="adamw", train=dict(dec_lr_scale=0.1, vit_lr_scale=0.1),
    ),
    "base-smollm2": Preset(
        about="ViT-B/16 (timm's weights) + SmolLM2-360M (32 layers, 960 wide, HuggingFaceTB/SmolLM2-360M, or its "
              "folder with --set dec_pretrained=DIR) with a gated cross-attention block every 4 layers (GPU)",
        model=dict(vit_name="vit_base_patch16_224", vit_patch_size=16, vit_pretrained=True,
                   dec_pretrained="HuggingFaceTB/SmolLM2-360M", dec_max_len=64, **LLAMA_DECODER,
                   dec_width=960, dec_depth=32, dec_heads=15, dec_kv_heads=5, dec_mlp_ratio=2560 / 960,
                   dec_rope_theta=100000.0, dec_cross_every=4),
        lr=1e-4, optimizer="adamw", train=dict(dec_lr_scale=0.1, vit_lr_scale=0.1),
    ),
}

# naming another timm model brings its own architecture: these preset fields then give way to timm's
VIT_ARCHITECTURE = ("vit_width", "vit_depth", "vit_heads", "vit_mlp_ratio")


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    return PRESETS[name]


def preset_fields(name: str, overrides: dict) -> dict:
    """The named preset's model fields with `overrides` on top (before a pretrained language model's own
    fields are applied; see `preset`)."""
    overrides = check_fields(ModelConfig, overrides, "model config")
    fields = dict(get_preset(name).model)
    if "vit_name" in overrides and overrides["vit_name"] != fields.get("vit_name"):
        for key in VIT_ARCHITECTURE:
            fields.pop(key, None)
    return {**fields, **overrides}


def preset(name: str, **overrides) -> ModelConfig:
    """The named preset's ModelConfig with fields overridden by keyword. Overriding `vit_name` with another
    model drops the preset's ViT width, depth and heads (unless they are overridden too), so
    `vit_name=vit_small_patch16_224` gives a real ViT-S; image size, patch size and the preset's other
    choices (conv stem, QK-norm) stay unless overridden.

    A preset whose decoder starts from a pretrained language model (`dec_pretrained`) gets that model's
    architecture and vocabulary from `vqa.model.model_preset`, which reads the language model's files; this
    function knows none of them and builds the fields as written."""
    return ModelConfig(**preset_fields(name, overrides))
