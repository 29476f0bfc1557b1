"""Checkpoints are folders: `model.safetensors` (weights, no pickle), `config.json` (the ModelConfig, which
includes the preprocessing: image size, mean, std), `tokenizer.json`, `card.json` (what it was trained on,
its scores), and for resuming `train_state.pt` (optimizer, scheduler, scaler, step, data position, RNG; read
with `weights_only=True`).

A run folder holds `best/` and `last/` checkpoints. Writes go to a temporary folder that is then renamed into
place, so an interrupted write never leaves a corrupt checkpoint: at worst the previous one stays (and if the
process dies between the two renames, `<name>.old` is picked up).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model

from .config import ModelConfig
from .errors import CheckpointError, ConfigError
from .model import VQAModel
from .tokenizer import Tokenizer

FILES = ("model.safetensors", "config.json", "tokenizer.json")


def resolve(path: str | Path) -> Path:
    """A checkpoint folder from a checkpoint or run folder: the folder itself, else its best/, else last/."""
    path = Path(path)
    for cand in (path, path / "best", path / "best.old", path / "last", path / "last.old"):
        if (cand / "model.safetensors").is_file():
            return cand
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}: the folder does not exist")
    raise CheckpointError(f"no checkpoint in {path}: expected model.safetensors there or in best/ or last/")


def recover(folder: str | Path) -> None:
    """Put `<name>.old` back when a save died between its two renames (the folder itself is then missing)."""
    folder = Path(folder)
    old = folder.with_name(folder.name + ".old")
    if not folder.exists() and old.exists():
        old.rename(folder)


def save(
    folder: str | Path,
    model: VQAModel,
    tokenizer: Tokenizer,
    card: dict | None = None,
    train_state: dict | None = None,
) -> Path:
    """Write a checkpoint folder atomically (temp folder + rename)."""
    folder = Path(folder)
    recover(folder)  # never delete the only good copy below
    tmp, old = folder.with_name(folder.name + ".tmp"), folder.with_name(folder.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model = getattr(model, "module", model)  # unwrap DDP
    model = getattr(model, "_orig_mod", model)  # unwrap torch.compile
    save_model(model, str(tmp / "model.safetensors"))  # handles the tied embedding / LM head
    model.cfg.save(tmp / "config.json")
    tokenizer.save(tmp / "tokenizer.json")
    (tmp / "card.json").write_text(json.dumps(card or {}, indent=2, default=str) + "\n")
    if train_state is not None:
        torch.save(train_state, tmp / "train_state.pt")
    _fsync_dir(tmp)
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
    return folder


def _fsync_dir(folder: Path) -> None:
    for f in folder.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())


def load(path: str | Path, device: str | torch.device = "cpu") -> tuple[VQAModel, Tokenizer, dict]:
    """(model in eval mode, tokenizer, card) from a checkpoint or run folder."""
    folder = resolve(path)
    for name in FILES:
        if not (folder / name).is_file():
            raise CheckpointError(f"checkpoint {folder} is missing {name}")
    try:
        cfg = ModelConfig.load(folder / "config.json")
    except (ConfigError, TypeError) as e:
        raise CheckpointError(f"{folder / 'config.json'}: incompatible config: {e}") from e
    cfg.vit_pretrained, cfg.vit_weights = False, None  # the weights come from the checkpoint
    tokenizer = Tokenizer.load(folder / "tokenizer.json")
    if tokenizer.vocab_size != cfg.vocab_size:
        raise CheckpointError(
            f"{folder}: tokenizer has {tokenizer.vocab_size} tokens but the model was built for {cfg.vocab_size}"
        )
    model = VQAModel(cfg)
    try:
        load_model(model, str(folder / "model.safetensors"), strict=True, device=str(device))
    except RuntimeError as e:
        raise CheckpointError(f"{folder / 'model.safetensors'} does not fit {folder / 'config.json'}: {e}") from e
    card_path = folder / "card.json"
    card = json.loads(card_path.read_text()) if card_path.is_file() else {}
    return model.to(device).eval(), tokenizer, card


def load_train_state(path: str | Path) -> dict:
    """The resume state; `weights_only=True` so a crafted file cannot run code."""
    f = Path(path) / "train_state.pt"
    if not f.is_file():
        raise CheckpointError(f"cannot resume: {f} does not exist")
    return torch.load(f, map_location="cpu", weights_only=True)
