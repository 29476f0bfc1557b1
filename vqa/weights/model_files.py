"""A model's own two files: `model.safetensors` (the weights, no pickle) and `config.json` (its ModelConfig with
the checkpoint format version, `vqa.weights.config_file`); a checkpoint folder (`vqa.weights.checkpoint`) holds
them beside its tokenizer and card."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import CheckpointError
from ..model import VQAModel
from . import config_file

WEIGHTS, CONFIG = "model.safetensors", "config.json"


def save(model: VQAModel, folder: str | Path) -> Path:
    """Write `model.safetensors` (no pickle) and `config.json` into `folder`."""
    from safetensors.torch import save_model

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_model(model, str(folder / WEIGHTS))  # handles the tied embedding / LM head
    config_file.write(model.cfg, folder / CONFIG)  # with the checkpoint format version
    return folder


def load(folder: str | Path, device: str | torch.device = "cpu") -> VQAModel:
    """The model saved in `folder` by `save` (or a checkpoint folder), in eval mode."""
    from safetensors import SafetensorError
    from safetensors.torch import load_model

    folder = Path(folder)
    for name in (WEIGHTS, CONFIG):
        if not (folder / name).is_file():
            raise CheckpointError(f"{folder} is missing {name}")
    cfg = config_file.read(folder / CONFIG)  # migrated from an older format, or refused if newer
    cfg.vit_pretrained, cfg.vit_weights = False, None  # the weights come from the file
    model = VQAModel(cfg)  # dec_pretrained stays in the config (where the decoder began); its weights are not read
    try:
        load_model(model, str(folder / WEIGHTS), strict=True, device=str(device))
    except SafetensorError as e:  # cut short (an interrupted copy or download), or not safetensors at all
        raise CheckpointError(f"{folder / WEIGHTS} is not a complete safetensors file: {e}") from None
    except RuntimeError as e:
        raise CheckpointError(f"{folder / WEIGHTS} does not fit {folder / CONFIG}: {e}") from e
    return model.to(device).eval()
