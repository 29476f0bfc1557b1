"""vqa's cache folder, shared by what it keeps between commands (the image cache, the files' digests):
$VQA_CACHE, else $XDG_CACHE_HOME/vqa, else ~/.cache/vqa (as other ML tools keep theirs)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_home() -> Path:
    """vqa's cache folder: $VQA_CACHE, else $XDG_CACHE_HOME/vqa, else ~/.cache/vqa."""
    if os.environ.get("VQA_CACHE"):
        return Path(os.environ["VQA_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "vqa"


__all__ = ["cache_home"]
