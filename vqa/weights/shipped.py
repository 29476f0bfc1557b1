"""The pretrained towers that ship inside the package: `vqa/weights/<name>/` is a checkpoint folder that
`vqa pretrain` made (scripts/ship_weights.py copies it there), with a card that names the command, the corpus,
the steps, the time, the weights' sha256 and the checkpoint's identity (`vqa.identity`). The tiny preset
starts from `tiny` unless a run asks for random weights (`vqa train --from-scratch`); in Python,
`shipped.load("tiny")` gives the model, its tokenizer and card. Nothing is downloaded: the files come with
the wheel."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import CheckpointError
from ..identity import sha256

WEIGHTS = Path(__file__).resolve().parent  # this package's folder: vqa/weights/


def folder(name: str) -> Path:
    """The checkpoint folder of the shipped towers `name`; a clear error if this install lacks them."""
    path = WEIGHTS / name
    if not (path / "model.safetensors").is_file():
        have = (sorted(p.name for p in WEIGHTS.iterdir() if (p / "model.safetensors").is_file())
                if WEIGHTS.is_dir() else [])
        raise CheckpointError(f"no shipped weights named {name!r} in {WEIGHTS} (this install has: "
                              f"{', '.join(have) or 'none'}); reinstall vqa, or train with --from-scratch")
    return path


def card(name: str) -> dict:
    """What the shipped towers are: the command that made them, the corpus, steps, time, sha256."""
    return json.loads((folder(name) / "card.json").read_text())


def describe(name: str) -> dict:
    """The line a fine-tuned run's card keeps about where its weights began."""
    c = card(name)
    return dict(weights=f"vqa/weights/{name}", command=c.get("command"), steps=c.get("steps"),
                sha256=c.get("sha256"), identity=c.get("identity"))


def load(name: str = "tiny", device="cpu"):
    """(model, tokenizer, card) of the shipped towers `name`, like `checkpoint.load` of a run."""
    from .checkpoint import load as load_checkpoint

    return load_checkpoint(folder(name), device=device)


__all__ = ["WEIGHTS", "card", "describe", "folder", "load", "sha256"]
