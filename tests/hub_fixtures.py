"""A Hugging Face cache laid out as huggingface_hub documents it (models--USER--NAME/snapshots/<commit>/... and
refs/<branch or tag> holding the commit), for the tests of loading by name with HF_HUB_OFFLINE=1; and the
monkeypatch that points huggingface_hub at it (its constants are read when it is imported)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

CHECKPOINT_FILES = ("model.safetensors", "config.json", "tokenizer.json", "card.json")


def add_snapshot(cache: Path, repo: str, source: Path, commit: str, refs=("main",), card: dict | None = None) -> Path:
    """Copy the checkpoint `source` into `cache` as commit `commit` of model repo `repo`, with `refs` naming it;
    `card` replaces its card.json. Returns the snapshot folder."""
    root = Path(cache) / ("models--" + repo.replace("/", "--"))
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True)
    for name in CHECKPOINT_FILES:
        shutil.copy2(Path(source) / name, snap / name)
    if card is not None:
        (snap / "card.json").write_text(json.dumps(card))
    (root / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (root / "refs" / ref).write_text(commit)
    return snap


def offline_cache(monkeypatch, cache: Path) -> None:
    """huggingface_hub reads `cache` alone, as HF_HUB_CACHE=cache HF_HUB_OFFLINE=1 would have it at import."""
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
