"""Model configuration and the named presets.

Fields are prefixed by the part they configure (`vit_*` for the image encoder, `dec_*` for the text decoder),
as in nanoVLM. A config is saved as `config.json` beside `model.safetensors` in every checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError


@dataclass
class ModelConfig:
    # image encoder (any timm ViT; `vit_name` picks the architecture, the sizes below override it)
    vit_name: str = "vit_tiny_patch16_224"
    vit_image_size: int = 64
    vit_patch_size: int = 8
    vit_width: int | None = None  # None: the timm model's own width; set for a custom-size ViT
    vit_depth: int | None = None
    vit_heads: int | None = None
    vit_pretrained: bool = False  # timm's own download (needs internet)
    vit_weights: str | None = None  # a local .safetensors / .pth file of timm ViT weights
    vit_conv_stem: bool = False  # 3x3 stride-2 convolutions instead of the patch projection (from scratch)
    vit_qk_norm: bool = False  # LayerNorm on each head's queries and keys (timm's qk_norm)
    vit_keep_prefix: bool = True  # keep the CLS / register tokens in the memory the decoder attends to
    vit_memory_pos: bool = False  # add fixed 2-D sin-cos positions to the image tokens the decoder attends to
    vit_freeze: bool = False
    vit_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    vit_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    # text decoder
    dec_width: int = 192
    dec_depth: int = 3
    dec_heads: int = 4
    dec_mlp_ratio: float = 4.0
    dec_max_len: int = 64  # the longest prompt + target, in tokens
    dec_positions: str = "sinusoidal"  # or "learned"
    dec_dropout: float = 0.0
    dec_qk_norm: bool = False  # LayerNorm on each head's queries and keys (self- and cross-attention)
    vocab_size: int = 1024  # set from the tokenizer when a model is built for a data set
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self) -> None:
        if self.dec_width % self.dec_heads:
            raise ConfigError(f"dec_width={self.dec_width} is not divisible by dec_heads={self.dec_heads}")
        if self.dec_positions not in ("sinusoidal", "learned"):
            raise ConfigError(f"dec_positions must be 'sinusoidal' or 'learned', not {self.dec_positions!r}")
        if self.vit_memory_pos and self.dec_width % 4:
            raise ConfigError(f"vit_memory_pos needs dec_width divisible by 4, not {self.dec_width}")
        if self.vit_image_size % self.vit_patch_size:
            raise ConfigError(
                f"vit_image_size={self.vit_image_size} is not a multiple of vit_patch_size={self.vit_patch_size}"
            )
        self.vit_mean = tuple(self.vit_mean)
        self.vit_std = tuple(self.vit_std)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown model config field(s): {', '.join(unknown)}")
        return cls(**d)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> ModelConfig:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}): {e.msg}") from e


PRESETS: dict[str, dict] = {
    # trains on 2 CPU cores in minutes: a narrow 3-layer ViT on 64 px images (a conv stem down to 8 px
    # patches), a 3-layer decoder, QK-norm everywhere, fixed 2-D positions on the memory. Narrow on purpose: in
    # ten CPU minutes a 96-wide model takes ~3x the steps of a 192-wide one and ends higher; the memory
    # positions let spatial questions be answered at all (docs/shapes-10min.md, sections 4-5)
    "tiny": dict(
        vit_name="vit_tiny_patch16_224", vit_image_size=64, vit_patch_size=8,
        vit_width=96, vit_depth=3, vit_heads=2, vit_conv_stem=True, vit_qk_norm=True, vit_memory_pos=True,
        dec_width=96, dec_depth=3, dec_heads=3, dec_max_len=48, dec_qk_norm=True,
    ),
    # ViT-S/16 at 224 px + a 6-layer decoder
    "small": dict(
        vit_name="vit_small_patch16_224", vit_image_size=224, vit_patch_size=16,
        vit_mean=(0.485, 0.456, 0.406), vit_std=(0.229, 0.224, 0.225),
        dec_width=384, dec_depth=6, dec_heads=6, dec_max_len=64,
    ),
    # ViT-B/16 at 224 px + an 8-layer decoder
    "base": dict(
        vit_name="vit_base_patch16_224", vit_image_size=224, vit_patch_size=16,
        vit_mean=(0.5, 0.5, 0.5), vit_std=(0.5, 0.5, 0.5),
        dec_width=768, dec_depth=8, dec_heads=12, dec_max_len=64,
    ),
}


def preset(name: str, **overrides) -> ModelConfig:
    """The named preset's config, with any field overridden by keyword."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    return ModelConfig(**{**PRESETS[name], **overrides})


__all__ = ["ModelConfig", "PRESETS", "preset", "field"]
