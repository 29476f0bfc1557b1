"""The image encoder: any timm ViT, returning its tokens projected to the decoder width."""

from __future__ import annotations

import torch
from torch import nn

from ..config import ModelConfig, timm_data_config
from ..errors import ConfigError, InputError


class ConvStemPatchEmbed(nn.Module):
    """timm's PatchEmbed with its single patch-sized convolution replaced by a stack of 3x3 stride-2
    convolutions (BatchNorm-free: GroupNorm + GELU), as in "Early convolutions help transformers see better"
    (Xiao et al., 2021). Neighbouring patches overlap, so a small object cut by a patch border is still seen
    whole; a ViT trained from scratch learns shapes several times faster. Output as PatchEmbed: [B, N, D]."""

    def __new__(cls, *args, **kwargs):
        from timm.layers import PatchEmbed

        embed = PatchEmbed(*args, **kwargs)
        p, dim = embed.patch_size[0], embed.proj.out_channels
        n = p.bit_length() - 1
        if p != embed.patch_size[1] or 2**n != p or n < 1:
            raise ConfigError(f"vit_conv_stem needs a square power-of-two patch size, not {embed.patch_size}")
        layers, c_in = [], embed.proj.in_channels
        for i in range(n):  # channels grow towards dim / 2, then a 1x1 projection to dim
            c_out = max(16, dim // 2 ** (n - i))
            layers += [nn.Conv2d(c_in, c_out, 3, stride=2, padding=1), nn.GroupNorm(1, c_out), nn.GELU()]
            c_in = c_out
        embed.proj = nn.Sequential(*layers, nn.Conv2d(c_in, dim, 1))
        return embed


def vit_kwargs(cfg: ModelConfig) -> dict:
    """`timm.create_model`'s arguments for the ViT `cfg` sizes (beside its name)."""
    kwargs = dict(num_classes=0, img_size=cfg.vit_image_size, patch_size=cfg.vit_patch_size)
    for key, value in (("embed_dim", cfg.vit_width), ("depth", cfg.vit_depth), ("num_heads", cfg.vit_heads),
                       ("mlp_ratio", cfg.vit_mlp_ratio)):
        if value is not None:
            kwargs[key] = value
    if cfg.vit_norm_eps is not None:
        import functools

        from timm.layers import LayerNorm

        kwargs["norm_layer"] = functools.partial(LayerNorm, eps=cfg.vit_norm_eps)
    if cfg.vit_qk_norm:
        kwargs["qk_norm"] = True
    if cfg.vit_conv_stem:
        kwargs["embed_layer"] = ConvStemPatchEmbed
    return kwargs


def create_vit(cfg: ModelConfig) -> nn.Module:
    """A timm ViT sized by `cfg`, with random weights (`vit_pretrained` / `vit_weights` are read by
    `vqa.weights.vit`, which `build_model` calls)."""
    import timm

    kwargs = vit_kwargs(cfg)
    timm_data_config(cfg.vit_name)  # a clear error for an unknown name
    if not cfg.vit_name.startswith(("vit_", "deit_", "eva")):
        raise ConfigError(f"{cfg.vit_name!r} is not a ViT; vqa needs a timm VisionTransformer")
    try:
        return timm.create_model(cfg.vit_name, pretrained=False, **kwargs)
    except (RuntimeError, OSError) as e:
        raise ConfigError(f"could not create {cfg.vit_name!r}: {e}") from e


class VisionEncoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.vit = create_vit(cfg)
        # the decoder reads every token: timm's pooling head (fc_norm of *_gap_* models, SigLIP's attention
        # pool, the classifier) would be parameters without gradients, which DDP refuses at step 2
        if isinstance(getattr(self.vit, "fc_norm", None), nn.Module):
            self.vit.fc_norm = nn.Identity()
        if getattr(self.vit, "attn_pool", None) is not None:
            self.vit.attn_pool = None
        if isinstance(getattr(self.vit, "head", None), nn.Module):
            self.vit.head = nn.Identity()
        self.num_prefix = getattr(self.vit, "num_prefix_tokens", 1)
        self.proj = nn.Linear(self.vit.embed_dim, cfg.dec_width)
        if cfg.vit_freeze:
            self.vit.requires_grad_(False)
        if cfg.vit_memory_pos:
            self.register_buffer("memory_pos", self.memory_positions(), persistent=False)  # [N, D]

    @property
    def grid(self) -> int:
        """Patches per side."""
        return self.cfg.grid

    def memory_positions(self) -> torch.Tensor:
        """Fixed 2-D sin-cos positions for the memory [N, D]: zeros on the prefix (CLS) tokens, then timm's
        MAE-style table for the patch grid (row-major, as the tokens): sin and cos of the row and of the
        column, dec_width / 4 frequencies each, base 100 (a few patches per side, not thousands)."""
        from timm.layers import build_sincos2d_pos_embed

        table = build_sincos2d_pos_embed([self.grid, self.grid], self.cfg.dec_width, temperature=100.0)
        return torch.cat([table.new_zeros(self.num_prefix, table.shape[1]), table])

    def check_images(self, images: torch.Tensor) -> None:
        s = self.cfg.vit_image_size
        if not torch.is_tensor(images) or images.ndim != 4 or tuple(images.shape[1:]) != (3, s, s):
            shape = tuple(images.shape) if torch.is_tensor(images) else type(images).__name__
            raise InputError(f"images must be a float tensor [B, 3, {s}, {s}] (RGB, {s} px square), got {shape}")
        if not images.is_floating_point():
            raise InputError(f"images must be normalized floats, got dtype {images.dtype}")

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """[B, 3, S, S] -> memory [B, N, D]: N = prefix (CLS / register) tokens + patches."""
        self.check_images(images)
        tokens = self.vit.forward_features(images)  # [B, prefix + grid^2, Dv], final norm applied
        memory = self.proj(tokens)  # [B, N, D]
        # a ViT's output tokens need not say where they are (a linear probe reads an object's x from a trained
        # tiny model's ViT input, not from its output), and spatial questions need the decoder to read it
        return memory + self.memory_pos if self.cfg.vit_memory_pos else memory
