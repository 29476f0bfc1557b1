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
    weights: str | None = None  # the shipped towers a new run starts from (vqa/weights/<name>), if any


# the decoder layout of GPT-2 (learned positions, tanh GELU, no embedding scale, no QK-norm)
GPT2_DECODER = dict(dec_positions="learned", dec_activation="gelu_tanh", dec_embed_scale=False, dec_qk_norm=False)

# the decoder layout of Llama / SmolLM2 (RMSNorm, rotary positions, SwiGLU, a tied head; vqa.model.llama_decoder)
LLAMA_DECODER = dict(dec_layout="llama", dec_positions="rotary", dec_activation="silu", dec_embed_scale=False,
                     dec_qk_norm=False, dec_tie_head=True)
VIT_NAMES = {"S": "vit_small_patch16_224", "B": "vit_base_patch16_224"}  # timm's ViT-S/16, ViT-B/16


def _gpt2(vit: str, lm: str, hub: str, *, depth: int) -> Preset:
    """ViT-`vit`/16 (timm's weights) + the GPT-2 `hub`; the decoder fields repeat its config.json."""
    return Preset(
        about=f"ViT-{vit}/16 (timm's weights) + {lm} ({depth} layers, 768 wide, {hub}) joined by new "
              "cross-attention (GPU; downloads both)",
        model=dict(vit_name=VIT_NAMES[vit], vit_patch_size=16, vit_pretrained=True, dec_pretrained=hub,
                   dec_max_len=64, **GPT2_DECODER, dec_width=768, dec_depth=depth, dec_heads=12),
        lr=1e-4, optimizer="adamw", train=dict(dec_lr_scale=0.2, vit_lr_scale=0.1),
    )


def _smollm2(vit: str, size: str, *, width: int, depth: int, heads: int, kv_heads: int, hidden: int,
             every: int) -> Preset:
    """ViT-`vit`/16 (timm's weights) + SmolLM2-`size`; the decoder fields repeat its config.json."""
    return Preset(
        about=f"ViT-{vit}/16 (timm's weights) + SmolLM2-{size} ({depth} layers, {width} wide, HuggingFaceTB/"
              f"SmolLM2-{size}, or its folder with --set dec_pretrained=DIR) with a gated cross-attention block "
              f"every {every} layers (GPU)",
        model=dict(vit_name=VIT_NAMES[vit], vit_patch_size=16, vit_pretrained=True,
                   dec_pretrained=f"HuggingFaceTB/SmolLM2-{size}",
                   dec_max_len=64, **LLAMA_DECODER, dec_width=width, dec_depth=depth, dec_heads=heads,
                   dec_kv_heads=kv_heads, dec_mlp_ratio=hidden / width, dec_rope_theta=100000.0,
                   dec_cross_every=every),
        lr=1e-4, optimizer="adamw", train=dict(dec_lr_scale=0.1, vit_lr_scale=0.1),
    )


PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        about="starts from the pretrained towers that ship in the package and trains on 2 CPU cores in "
              "minutes: a narrow 3-layer ViT on 64 px images "
              "with a conv stem down to 8 px patches, a 3-layer decoder, QK-norm everywhere, fixed 2-D "
              "positions on the memory",
        model=dict(
            vit_name="vit_tiny_patch16_224", vit_image_size=64, vit_patch_size=8,
            vit_width=96, vit_depth=3, vit_heads=2, vit_conv_stem=True, vit_qk_norm=True, vit_memory_pos=True,
            dec_width=96, dec_depth=3, dec_heads=3, dec_max_len=48, dec_qk_norm=True,
        ),
        # a from-scratch encoder that moves more slowly than the decoder lets the cross-attention settle
        # sooner; Muon learns the from-scratch model in far fewer steps; a second caption of each image a step
        # shows the listing captions that teach position twice as often, for more decoder tokens a step; the
        # grounding loss, on where a set has boxes, is what the shipped towers were pretrained with
        lr=1e-3, optimizer="muon", train=dict(vit_lr_scale=0.3, captions_per_image=2, grounding_weight=1.0),
        weights="tiny",
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
    "small-gpt2": _gpt2("S", "DistilGPT-2", "distilbert/distilgpt2", depth=6),
    "base-gpt2": _gpt2("B", "GPT-2", "openai-community/gpt2", depth=12),
    # Llama-layout language models (vqa.model.llama_decoder): gated cross-attention blocks before every
    # dec_cross_every-th layer (mllama: one in five); the language model and the ViT at a tenth of the new
    # blocks' rate (starting points, not tuned here)
    "small-smollm2": _smollm2("S", "135M", width=576, depth=30, heads=9, kv_heads=3, hidden=1536, every=3),
    "base-smollm2": _smollm2("B", "360M", width=960, depth=32, heads=15, kv_heads=5, hidden=2560, every=4),
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
    architecture and vocabulary from `vqa.weights.language_model.model_preset`, which reads the language
    model's files; this function knows none of them and builds the fields as written."""
    return ModelConfig(**preset_fields(name, overrides))
