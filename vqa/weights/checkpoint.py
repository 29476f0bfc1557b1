"""Checkpoints are folders: `model.safetensors` (weights, no pickle), `config.json` (the ModelConfig, which
includes the preprocessing: image size, mean, std; and the checkpoint format version, `vqa.weights.config_file`),
`tokenizer.json`, `card.json` (what it was trained on, its scores), LoRA adapters where the run trained
them (`adapter.safetensors`, `adapter_config.json`, `vqa.weights.lora`), and for resuming `train_state.pt`
(optimizer, scheduler, scaler, step, data position, RNG; read with `weights_only=True`).

A run folder holds `best/` and `last/` checkpoints. Writes go to a temporary folder that is then renamed into
place, so an interrupted write never leaves a corrupt checkpoint: at worst the previous one stays (and if the
process dies between the two renames, `<name>.old` is picked up).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import uuid
from pathlib import Path

import torch

from ..errors import CheckpointError
from ..model import VQAModel
from ..tokenizer import Tokenizer
from . import hub, model_files
from .lora import base_layers, load_adapters, merge_lora, save_adapters

FILES = ("model.safetensors", "config.json", "tokenizer.json")


def resolve(path: str | Path, revision: str | None = None) -> Path:
    """A checkpoint folder from a checkpoint or run folder: the folder itself, else its best/, else last/. A
    string that is no folder here but a Hub name (`user/name[@rev]`) is downloaded first (`vqa.weights.hub`)."""
    path = hub.locate(path, revision)
    for cand in (path, path / "best", path / "best.old", path / "last", path / "last.old"):
        if (cand / "model.safetensors").is_file():
            return cand
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}: the folder does not exist")
    raise CheckpointError(f"no checkpoint in {path}: expected model.safetensors there or in best/ or last/")


def recover(folder: str | Path) -> None:
    """Put `<name>.old` back when a save died between its two renames (the folder itself is then missing),
    and remove the temporary folders of saves that died before their renames. Call it where no other
    process is saving into the run (the trainer does, holding the run's lock)."""
    folder = Path(folder)
    recover_only_old(folder)
    for tmp in folder.parent.glob(folder.name + ".tmp*"):
        shutil.rmtree(tmp, ignore_errors=True)


def save(
    folder: str | Path,
    model: VQAModel,
    tokenizer: Tokenizer,
    card: dict | None = None,
    train_state: dict | None = None,
) -> Path:
    """Write a checkpoint folder atomically: into a temporary folder of a name no other save uses, then
    renamed into place (the previous copy is moved aside first and deleted last)."""
    folder = Path(folder)
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    old = folder.with_name(folder.name + ".old")
    tmp.mkdir(parents=True)
    try:
        model = getattr(model, "module", model)  # unwrap DDP
        model = getattr(model, "_orig_mod", model)  # unwrap torch.compile
        with base_layers(model):  # base weights under their own names; LoRA adapters beside them
            model_files.save(model, tmp)
        save_adapters(model, tmp)
        tokenizer.save(tmp / "tokenizer.json")
        (tmp / "card.json").write_text(json.dumps(card or {}, indent=2, default=str) + "\n")
        if train_state is not None:
            torch.save(train_state, tmp / "train_state.pt")
        _fsync_dir(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    with _swap_lock(folder):  # two processes saving one folder take turns at the renames
        recover_only_old(folder)
        shutil.rmtree(old, ignore_errors=True)
        if folder.exists():
            folder.rename(old)
        tmp.rename(folder)
        shutil.rmtree(old, ignore_errors=True)
    return folder


@contextlib.contextmanager
def _swap_lock(folder: Path):
    """An exclusive lock on `.<name>.lock` beside the folder for the few renames of a save (filelock's
    descriptor lock, any platform). The run lock keeps two trainers apart; this keeps any two savers' renames apart."""
    from filelock import lock_descriptor, unlock_descriptor

    with open(folder.with_name(f".{folder.name}.lock"), "a") as f:
        lock_descriptor(f.fileno())
        try:
            yield
        finally:
            unlock_descriptor(f.fileno())


def recover_only_old(folder: Path) -> None:
    old = folder.with_name(folder.name + ".old")
    if not folder.exists() and old.exists():
        old.rename(folder)


def _fsync_dir(folder: Path) -> None:
    for f in folder.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())


def load(path: str | Path, device: str | torch.device = "cpu", merge_adapters: bool = True,
         revision: str | None = None) -> tuple[VQAModel, Tokenizer, dict]:
    """(model in eval mode, tokenizer, card) from a checkpoint or run folder, or a Hub name (`resolve`). LoRA
    adapters saved beside the weights are merged into them, one plain model (`merge_adapters=False` keeps them
    apart, to train on)."""
    folder = resolve(path, revision)
    for name in FILES:
        if not (folder / name).is_file():
            raise CheckpointError(f"checkpoint {folder} is missing {name}")
    model = model_files.load(folder, device=device)  # first: its config.json says the format version
    if load_adapters(model, folder) and merge_adapters:
        merge_lora(model)
    tokenizer = Tokenizer.load(folder / "tokenizer.json")
    if tokenizer.vocab_size != model.cfg.vocab_size:
        raise CheckpointError(
            f"{folder}: tokenizer has {tokenizer.vocab_size} tokens but the model was built for {model.cfg.vocab_size}"
        )
    return model, tokenizer, read_card(folder)


def read_card(folder: Path) -> dict:
    """The card.json of checkpoint `folder` ({} without one); CheckpointError naming it when it is no object."""
    card_path = folder / "card.json"
    try:
        card = json.loads(card_path.read_text()) if card_path.is_file() else {}
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{card_path}: not valid JSON ({e.msg})") from None
    if not isinstance(card, dict):
        raise CheckpointError(f"{card_path}: expected a JSON object (the model card), got {type(card).__name__}")
    return card


def load_train_state(path: str | Path) -> dict:
    """The resume state; `weights_only=True` so a crafted file cannot run code."""
    f = Path(path) / "train_state.pt"
    if not f.is_file():
        raise CheckpointError(f"cannot resume: {f} does not exist")
    try:
        state = torch.load(f, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        code = next((line for line in lines if "GLOBAL" in line), None)  # weights_only met a class or function
        if code:
            raise CheckpointError(f"cannot resume: {f} holds Python objects that loading it would have to run, so "
                                  f"it is refused (Weights only load failed: {code})") from None
        # anything else is not a pickle torch writes: name the unpickler's own reason, not its advice
        reason = next((line for line in lines if line.startswith("Unsupported")),
                      lines[0] if lines else type(e).__name__)
        raise CheckpointError(f"cannot resume: {f} is not a train state torch can read ({reason})") from None
    except (RuntimeError, EOFError, OSError) as e:  # cut short or damaged: torch's zip reader or the unpickler
        first = str(e).split(". ")[0] or type(e).__name__
        raise CheckpointError(f"cannot resume: {f} is not a complete train state ({first}); train again without "
                              "--resume, or start a new run with --init-from to keep the weights") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"cannot resume: {f} holds a {type(state).__name__}, not a train state")
    return state
