"""`ModelConfig`: the architecture, saved as `config.json` beside `model.safetensors` in every checkpoint.
Fields are prefixed by the part they configure (`vit_*` image encoder, `dec_*` text decoder), as in nanoVLM."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .base import _Config, number_problem, scalar_type, type_problem


@functools.lru_cache(maxsize=64)
def timm_data_config(vit_name: str) -> dict:
    """timm's input size, mean and std for `vit_name` (a model name, optionally with its weights' tag, e.g.
    `vit_small_patch16_224.augreg_in1k`): `timm.data.resolve_data_config` on the model's pretrained config,
    what `resolve_model_data_config(create_model(vit_name))` gives without building the model."""
    import timm
    from timm.data import resolve_data_config
    from timm.models import get_pretrained_cfg

    if not timm.is_model(vit_name):
        close = timm.list_models(f"*{vit_name.split('_')[0]}*")[:8] if vit_name else []
        raise ConfigError(f"unknown timm model {vit_name!r}" + (f"; similar: {', '.join(close)}" if close else ""))
    cfg = get_pretrained_cfg(vit_name)
    return resolve_data_config(pretrained_cfg=cfg.to_dict() if cfg is not None else {})


DEC_ACTIVATIONS = ("gelu", "gelu_tanh", "silu")
# "gpt": LayerNorm blocks with added positions, a cross-attention in every block; "llama": RMSNorm, rotary
# positions, grouped-query attention, SwiGLU, gated cross-attention blocks every dec_cross_every layers
DEC_LAYOUTS = ("gpt", "llama")
VIT_RESIZE, VIT_RESAMPLE = ("letterbox", "squash"), ("bicubic", "bilinear")
# what every pretrained (GPT-2-layout) decoder fixes whatever its config.json says, and why (`dec_pretrained`)
PRETRAINED_FIXED = {
    "dec_qk_norm": (False, "the language model has no LayerNorm on queries and keys"),
    "dec_positions": ("learned", "the language model's positions are its learned table (wpe)"),
    "dec_embed_scale": (False, "the language model adds its token embeddings unscaled"),
}
# the llama layout's own fields at their defaults, which the gpt layout keeps
LLAMA_ONLY = dict(dec_kv_heads=None, dec_head_dim=None, dec_rope_theta=10000.0, dec_rope_scaling=None,
                  dec_qkv_bias=False, dec_tie_head=True, dec_cross_every=1)

# the numeric fields' ranges on their own: field -> (the lowest value, whether a value must be above it, the
# value it must stay below); `check_field` applies them, `ModelConfig` the rules that join fields
RANGES: dict[str, tuple[float, bool, float | None]] = {
    **dict.fromkeys(("vit_image_size", "vit_patch_size", "vit_width", "vit_depth", "vit_heads", "dec_width",
                     "dec_depth", "dec_heads", "dec_max_len", "vocab_size", "dec_kv_heads", "dec_head_dim",
                     "dec_cross_every"), (1, False, None)),
    "dec_rope_theta": (0, True, None),
    **dict.fromkeys(("pad_id", "bos_id", "eos_id"), (0, False, None)),
    **dict.fromkeys(("vit_mlp_ratio", "vit_norm_eps", "dec_mlp_ratio", "dec_norm_eps"), (0, True, None)),
    "dec_dropout": (0, False, 1),
}


def check_field(name: str, value: Any) -> str | None:
    """What is wrong with `value` for ModelConfig field `name` on its own (its type, its range), e.g.
    "dec_depth must be an integer"; None when nothing is. `vqa train --set` checks each value with it before
    anything runs; `ModelConfig` checks every field with it, and then the rules that join fields."""
    problem = type_problem(ModelConfig, name, value)
    if problem:
        return problem
    if name in ("vit_mean", "vit_std") and value is not None:
        ok = isinstance(value, (list, tuple)) and len(value) == 3 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)
        if not ok or (name == "vit_std" and min(value) <= 0):
            positive = " > 0" if name == "vit_std" else ""
            return f"{name} must be three finite numbers{positive} (red, green, blue) or null"
    if name == "dec_rope_scaling" and value is not None:
        ok = isinstance(value, (list, tuple)) and len(value) == 4 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in value)
        if not ok:
            return ("dec_rope_scaling must be four positive numbers (Llama 3's factor, low_freq_factor, "
                    "high_freq_factor, original_max_position_embeddings) or null")
    if name in RANGES:
        lo, above, below = RANGES[name]
        integer = scalar_type(ModelConfig, name)[0] is int
        return number_problem(name, value, lo, above=above, below=below, integer=integer)
    return None


@dataclass
class ModelConfig(_Config):
    # image encoder (any timm ViT; `vit_name` picks the architecture and, after a dot, the weights' tag)
    vit_name: str = "vit_tiny_patch16_224"  # a timm ViT, optionally with its weights' tag after a dot
    vit_image_size: int | None = None  # None: timm's input size for vit_name
    vit_patch_size: int = 16  # pixels per patch side (a power of two with vit_conv_stem)
    vit_width: int | None = None  # None: the timm model's own width; set for a custom-size ViT
    vit_depth: int | None = None  # None: the timm model's own number of blocks
    vit_heads: int | None = None  # None: the timm model's own number of attention heads
    vit_mlp_ratio: float | None = None  # None: the timm model's own MLP width / vit_width (4 for a ViT)
    vit_norm_eps: float | None = None  # None: timm's LayerNorm epsilon (1e-6); an imported ViTModel keeps its 1e-12
    vit_pretrained: bool = False  # timm's own download (needs internet)
    vit_weights: str | None = None  # a local .safetensors / .pth file of timm ViT weights
    vit_conv_stem: bool = False  # 3x3 stride-2 convolutions instead of the patch projection (from scratch)
    vit_qk_norm: bool = False  # LayerNorm on each head's queries and keys (timm's qk_norm)
    vit_memory_pos: bool = False  # add fixed 2-D sin-cos positions to the image tokens the decoder attends to
    vit_freeze: bool = False  # no gradients for the ViT (its projection to the decoder still trains)
    vit_mean: tuple[float, float, float] | None = None  # None: timm's for vit_name (its weights' statistics)
    vit_std: tuple[float, float, float] | None = None  # None: timm's for vit_name, like vit_mean
    vit_resize: str = "letterbox"  # "letterbox" (aspect kept, padded) or "squash" (stretched, as ViTImageProcessor)
    vit_resample: str = "bicubic"  # the resize filter: "bicubic" or "bilinear" (ViTImageProcessor's default)
    # text decoder
    dec_pretrained: str | None = None  # a causal LM (Hugging Face folder or Hub name): its weights start the decoder
    dec_width: int = 192  # the decoder's model width (the image tokens are projected to it)
    dec_depth: int = 3  # decoder blocks (self-attention, cross-attention, MLP)
    dec_heads: int = 4  # attention heads per layer (dec_width must divide by it)
    dec_mlp_ratio: float = 4.0  # the MLP's hidden width / dec_width
    dec_max_len: int = 64  # the longest prompt + target, in tokens
    dec_positions: str = "sinusoidal"  # the positions added to the tokens: "sinusoidal" (fixed) or "learned"
    dec_dropout: float = 0.0  # dropout in the decoder (embeddings, attention, residual branches) while training
    dec_qk_norm: bool = False  # LayerNorm on each head's queries and keys (self- and cross-attention)
    dec_activation: str = "gelu"  # the MLP's: "gelu" (exact) or "gelu_tanh" (GPT-2's gelu_new)
    dec_embed_scale: bool = True  # token embeddings x sqrt(dec_width) before the positions are added (GPT-2: no)
    dec_norm_eps: float = 1e-5  # the decoder's LayerNorm epsilon (RMSNorm's in the llama layout)
    dec_layout: str = "gpt"  # "gpt" (GPT-2's blocks) or "llama" (Llama / Qwen blocks, vqa.model.llama_decoder)
    dec_kv_heads: int | None = None  # llama: key/value heads (grouped-query attention); None: dec_heads
    dec_head_dim: int | None = None  # llama: width of one head; None: dec_width // dec_heads
    dec_rope_theta: float = 10000.0  # llama: the rotary positions' base
    dec_rope_scaling: tuple[float, float, float, float] | None = None  # llama: Llama 3's rotary frequency scaling
    dec_qkv_bias: bool = False  # llama: biases on the query, key and value projections (Qwen2)
    dec_tie_head: bool = True  # llama: the LM head is the token embedding; False: its own matrix
    dec_cross_every: int = 1  # llama: a gated cross-attention block before every k-th language model layer
    vocab_size: int = 1024  # set from the tokenizer when a model is built for a data set
    pad_id: int = 0  # the tokenizer's <pad> id (set with vocab_size)
    bos_id: int = 1  # the tokenizer's <bos> id
    eos_id: int = 2  # the tokenizer's <eos> id: generation stops at it

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            problem = check_field(f.name, getattr(self, f.name))
            if problem:
                raise ConfigError(f"{problem}, got {getattr(self, f.name)!r}")
        if self.vit_image_size is None or self.vit_mean is None or self.vit_std is None:
            data = timm_data_config(self.vit_name)
            self.vit_image_size = self.vit_image_size or int(data["input_size"][-1])
            self.vit_mean = self.vit_mean or data["mean"]
            self.vit_std = self.vit_std or data["std"]
        self.vit_mean = tuple(float(m) for m in self.vit_mean)
        self.vit_std = tuple(float(s) for s in self.vit_std)
        if self.dec_rope_scaling is not None:
            self.dec_rope_scaling = tuple(float(v) for v in self.dec_rope_scaling)
        if self.dec_width % self.dec_heads and not (self.dec_layout == "llama" and self.dec_head_dim):
            raise ConfigError(f"dec_width={self.dec_width} is not divisible by dec_heads={self.dec_heads}")
        if self.dec_layout not in DEC_LAYOUTS:
            raise ConfigError(f"dec_layout must be one of {', '.join(map(repr, DEC_LAYOUTS))}, not {self.dec_layout!r}")
        if self.dec_layout == "llama":
            self._check_llama()
        elif wrong := [f"{k}={getattr(self, k)!r}" for k, v in LLAMA_ONLY.items() if getattr(self, k) != v]:
            raise ConfigError(f"{', '.join(wrong)} need dec_layout='llama' (a Llama-layout language model's "
                              "dec_pretrained sets it); the gpt layout has none of them")
        elif self.dec_positions not in ("sinusoidal", "learned"):
            raise ConfigError(f"dec_positions must be 'sinusoidal' or 'learned', not {self.dec_positions!r}")
        for key, allowed in (("vit_resize", VIT_RESIZE), ("vit_resample", VIT_RESAMPLE)):
            if getattr(self, key) not in allowed:
                raise ConfigError(f"{key} must be one of {', '.join(map(repr, allowed))}, not {getattr(self, key)!r}")
        if self.dec_positions == "sinusoidal" and self.dec_width % 2:
            raise ConfigError(f"dec_width={self.dec_width} must be even for dec_positions='sinusoidal' (sine and "
                              "cosine pairs); use an even width or dec_positions='learned'")
        if self.vit_width is not None and self.vit_heads is not None and self.vit_width % self.vit_heads:
            raise ConfigError(f"vit_width={self.vit_width} is not divisible by vit_heads={self.vit_heads}")
        if self.dec_activation not in DEC_ACTIVATIONS:
            raise ConfigError(f"dec_activation must be one of {', '.join(map(repr, DEC_ACTIVATIONS))}, "
                              f"not {self.dec_activation!r}")
        for key, (want, why) in PRETRAINED_FIXED.items() if self.dec_pretrained and self.dec_layout == "gpt" else ():
            if getattr(self, key) != want:
                raise ConfigError(f"{key}={getattr(self, key)!r} cannot be combined with dec_pretrained="
                                  f"{self.dec_pretrained!r}: {why}, so the decoder would not start as that model")
        if self.vit_memory_pos and self.dec_width % 4:
            raise ConfigError(f"vit_memory_pos needs dec_width divisible by 4, not {self.dec_width}")
        if self.vit_image_size % self.vit_patch_size:
            raise ConfigError(
                f"vit_image_size={self.vit_image_size} is not a multiple of vit_patch_size={self.vit_patch_size}"
            )

    def _check_llama(self) -> None:
        """The llama layout's fields agree with each other."""
        fixed = dict(dec_positions="rotary", dec_activation="silu", dec_embed_scale=False)
        wrong = [f"{k}={getattr(self, k)!r}" for k, v in fixed.items() if getattr(self, k) != v]
        if wrong:
            raise ConfigError(f"dec_layout='llama' has rotary positions, SwiGLU and unscaled embeddings: "
                              f"{', '.join(wrong)} must be " + ", ".join(f"{k}={v!r}" for k, v in fixed.items()))
        if self.dec_heads % self.kv_heads:
            raise ConfigError(f"dec_heads={self.dec_heads} is not a multiple of dec_kv_heads={self.dec_kv_heads}")
        if self.head_dim % 2:
            raise ConfigError(f"the head width {self.head_dim} must be even for rotary positions")

    @property
    def cross_layers(self) -> int:
        """How many cross-attention layers the decoder has: one per block, or the llama layout's gated blocks."""
        return len(self.cross_layer_ids)

    @property
    def cross_layer_ids(self) -> tuple[int, ...]:
        """The language model's layers (0-based) that have a cross-attention: each one, or in the llama layout
        those its gated blocks sit before (every dec_cross_every-th)."""
        return tuple(range(0, self.dec_depth, self.dec_cross_every if self.dec_layout == "llama" else 1))

    @property
    def kv_heads(self) -> int:
        """Self-attention's key/value heads (fewer than dec_heads: grouped-query attention)."""
        return self.dec_kv_heads or self.dec_heads

    @property
    def head_dim(self) -> int:
        """The decoder's width of one attention head."""
        return self.dec_head_dim or self.dec_width // self.dec_heads

    @property
    def grid(self) -> int:
        """Image patches per side."""
        return self.vit_image_size // self.vit_patch_size
