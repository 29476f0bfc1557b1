"""A ViT encoder's pretrained weights, copied into a built model: timm's own (`vit_pretrained`: timm downloads
them) or a local file (`vit_weights`: .safetensors or .pth, through timm's `pretrained_cfg_overlay`)."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from ..config import ModelConfig
from ..errors import ConfigError
from ..model.vision import vit_kwargs


def load_vit(vit: nn.Module, cfg: ModelConfig) -> None:
    """Copy the weights `cfg` names into `vit` (made by `vqa.model.vision.create_vit` from the same `cfg`)."""
    import timm

    kwargs = vit_kwargs(cfg)
    if cfg.vit_weights:
        if not Path(cfg.vit_weights).is_file():
            raise ConfigError(f"vit_weights: no file at {cfg.vit_weights}")
        kwargs["pretrained_cfg_overlay"] = dict(file=str(cfg.vit_weights))
    try:
        source = timm.create_model(cfg.vit_name, pretrained=True, **kwargs)
    except (RuntimeError, OSError) as e:
        raise ConfigError(f"could not load the weights of {cfg.vit_name!r}: {e}") from e
    vit.load_state_dict(source.state_dict())


__all__ = ["load_vit"]
