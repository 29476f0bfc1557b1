"""What names a model: `checkpoint_identity(folder)`, a digest of the whole content of every file of a checkpoint
folder that changes an output (IDENTITY_FILES), so two checkpoints share it only when they hold the same bytes
there, and a copy of a checkpoint has its original's.

Each file's sha256 is remembered in vqa's cache folder (`digests.json`) under the file's real path, size,
modification time (ns), inode and device, so a large file is read once, not at every command; any change to
the file changes that key. A file modified less than RACY_SECONDS before it was read is not remembered (a
rewrite within one tick of the clock would keep its key), nor one that changed while it was read. A cache that
cannot be read or parsed is ignored (and rewritten whole); writers take turns under a lock beside it and
replace it with `os.replace`, which readers see whole or not at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

from filelock import lock_descriptor, unlock_descriptor

from .cache_home import cache_home

# a checkpoint's files that change what it outputs: weights, LoRA adapters (vqa.weights.lora), the ModelConfig
# (with the preprocessing), the tokenizer. NOT_OUTPUTS change none: the card (what it was trained on, its
# scores; its `tasks` only decide whether a task is refused) and the resume state.
IDENTITY_FILES = ("model.safetensors", "adapter.safetensors", "adapter_config.json", "config.json", "tokenizer.json")
NOT_OUTPUTS = ("card.json", "train_state.pt")
DIGESTS = "digests.json"
RACY_SECONDS = 2.0
MAX_ENTRIES = 1024  # the oldest remembered digests go first
BLOCK = 1 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")


def digest_cache() -> Path:
    return cache_home() / DIGESTS


def _key(path: str, st: os.stat_result) -> str:
    return f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\0{st.st_dev}"


def _read(cache: Path) -> dict[str, str]:
    """The remembered digests; {} when the cache is missing, unreadable or not this module's JSON."""
    try:
        entries = json.loads(cache.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(entries, dict):
        return {}
    return {k: v for k, v in entries.items() if isinstance(v, str) and _SHA256.fullmatch(v)}


def _remember(cache: Path, key: str, digest: str) -> None:
    """Add one digest under the cache's lock; best effort: a folder that cannot be written costs a re-read."""
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        with open(cache.with_name(f".{cache.name}.lock"), "a") as lock:
            lock_descriptor(lock.fileno())
            try:
                entries = _read(cache)
                entries.pop(key, None)
                entries[key] = digest
                kept = dict(list(entries.items())[-MAX_ENTRIES:])
                tmp = cache.with_name(f".{cache.name}.tmp{os.getpid()}")
                tmp.write_text(json.dumps(kept), encoding="utf-8")
                os.replace(tmp, cache)
            finally:
                unlock_descriptor(lock.fileno())
    except OSError:
        pass


def sha256(path: str | Path) -> str:
    """The sha256 of the whole file `path` (hex), read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def file_digest(path: str | Path) -> str:
    """The sha256 of the whole file `path` (hex), remembered under its path, size, mtime and inode."""
    real = os.path.realpath(path)
    before = os.stat(real)
    key, cache = _key(real, before), digest_cache()
    known = _read(cache).get(key)
    if known is not None:
        return known
    digest = sha256(real)
    settled = time.time() - before.st_mtime > RACY_SECONDS
    if settled and _key(real, os.stat(real)) == key:
        _remember(cache, key, digest)
    return digest


def checkpoint_identity(folder: str | Path) -> str:
    """16 hex digits of the names and whole contents of the IDENTITY_FILES that `folder` holds."""
    folder = Path(folder)
    h = hashlib.sha256()
    for name in IDENTITY_FILES:
        f = folder / name
        if f.is_file():
            h.update(f"{name}\0{file_digest(f)}\n".encode())
    return h.hexdigest()[:16]


__all__ = ["IDENTITY_FILES", "NOT_OUTPUTS", "checkpoint_identity", "digest_cache", "file_digest", "sha256"]
