"""The image cache's folder: where `--image-cache auto` keeps its files, the total budget over them, and
`vqa data cache` (list, `--clear`).

Home: $VQA_CACHE/images, else $XDG_CACHE_HOME/vqa/images, else ~/.cache/vqa/images (as other ML tools keep
theirs). One file per image list, size and padding colour (`<hash>-<size>px.u8`), each with a `.lock` beside
it that every process using the file holds (shared) for as long as it does: a file whose lock is held is in
use and is never removed. Making, evicting and clearing files happen under one folder lock
(`.vqa-image-cache.lock`), so two runs never overshoot the budget together and no process takes a file's lock
while another removes it. When a new file would not fit the budget, the least recently used files (by
modification time: opening a file touches it) that no process holds are removed, whole, until it does.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from filelock import lock_descriptor

from ..cache_home import cache_home

try:
    import fcntl  # the shared holds: flock's LOCK_SH, which filelock does not offer
except ImportError:  # Windows
    fcntl = None

MAGIC = b"VQAIMGCACHE1\n"
HEADER = 4096
FOLDER_LOCK = ".vqa-image-cache.lock"
NAME = re.compile(r"[0-9a-f]{16}-\d+px\.u8")  # the files this module made; nothing else is ever removed
TMP = re.compile(r"([0-9a-f]{16}-\d+px\.u8)\.tmp(\d+)")
NETWORK_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "fuse.sshfs", "9p", "ceph",
              "glusterfs", "fuse.glusterfs", "afs"}


def image_cache_dir() -> Path:
    return cache_home() / "images"


def network_filesystem(path: Path, mounts_text: str | None = None) -> str | None:
    """The type of the network filesystem `path` is on (nfs, lustre, ...), or None (local, or unknown);
    `mounts_text` in the format of /proc/self/mounts (read from there by default)."""
    try:
        mounts = (Path("/proc/self/mounts").read_text() if mounts_text is None else mounts_text).splitlines()
    except OSError:
        return None
    p = os.path.realpath(path)
    best, kind = "", None
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        mnt = parts[1].replace("\\040", " ")
        if (p == mnt or p.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
            best, kind = mnt, parts[2]
    return kind if kind in NETWORK_FS else None


@contextlib.contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """Exclusive, for making, evicting or clearing files in `folder` (made if missing)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / FOLDER_LOCK, "a+") as f:
        lock_descriptor(f.fileno())
        yield


def lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def hold(path: Path):
    """Mark `path` in use: its lock, held shared until the returned file is closed (call under folder_lock)."""
    f = open(lock_path(path), "a+")  # noqa: SIM115 - held open for the life of the cache
    if fcntl is not None:
        fcntl.flock(f, fcntl.LOCK_SH)
    # without fcntl (Windows) the open file marks it: a file held open and mapped cannot be removed there
    return f


def remove_if_unused(path: Path) -> bool:
    """Remove the cache file `path` and its lock unless a process holds it (call under folder_lock)."""
    try:
        f = open(lock_path(path), "a+")  # noqa: SIM115
    except OSError:
        return False
    with f:
        if not lock_descriptor(f.fileno(), blocking=False):
            return False
        try:
            path.unlink(missing_ok=True)
        except PermissionError:  # Windows: open in another process
            return False
        lock_path(path).unlink(missing_ok=True)  # no one waits on it: locks are only taken under folder_lock
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


@dataclass
class Entry:
    path: Path
    bytes: int
    last_used: float
    in_use: bool
    images: int | None = None  # from the header (None: not readable)
    side: int | None = None
    filled: int | None = None


def _describe(path: Path, file_stat: os.stat_result, in_use: bool) -> Entry:
    e = Entry(path, file_stat.st_size, file_stat.st_mtime, in_use)
    try:
        with open(path, "rb") as f:
            raw = f.read(HEADER)
            meta = json.loads(raw[len(MAGIC):].split(b"\n", 1)[0]) if raw.startswith(MAGIC) else {}
            if meta:
                e.images, e.side = int(meta["n"]), int(meta["size"])
                e.filled = sum(1 for b in f.read(e.images) if b)
    except (OSError, ValueError, KeyError):
        pass
    return e


def _in_use(path: Path) -> bool:
    lock = lock_path(path)
    if not lock.exists():
        return False
    with open(lock, "a+") as f:
        return not lock_descriptor(f.fileno(), blocking=False)


def entries(folder: Path, details: bool = False) -> list[Entry]:
    """The cache files in `folder`, least recently used first (call under folder_lock). Leftovers of a
    process that died while making a file are removed."""
    out = []
    if not folder.is_dir():
        return out
    for p in folder.iterdir():
        m = TMP.fullmatch(p.name)
        if m and not _alive(int(m[2])):
            p.unlink(missing_ok=True)
            continue
        if not NAME.fullmatch(p.name):
            continue
        try:
            file_stat = p.stat()
        except OSError:
            continue
        use = _in_use(p)
        out.append(_describe(p, file_stat, use) if details
                   else Entry(p, file_stat.st_size, file_stat.st_mtime, use))
    return sorted(out, key=lambda e: (e.last_used, e.path.name))


def make_room(folder: Path, keep: Path, need: int, budget: int) -> tuple[bool, int]:
    """Remove least recently used files no process holds (never `keep`) until the others and `need` bytes fit
    `budget` (call under folder_lock). -> (whether they fit, bytes the others still take)."""
    others = [e for e in entries(folder) if e.path != keep]
    total = sum(e.bytes for e in others)
    for e in others:
        if total + need <= budget:
            break
        if not e.in_use and remove_if_unused(e.path):
            total -= e.bytes
    return total + need <= budget, total


def touch(path: Path) -> None:
    """Mark `path` used now (the order eviction goes by)."""
    with contextlib.suppress(OSError):
        now = time.time()
        os.utime(path, (now, now))


def clear(folder: Path) -> tuple[list[Entry], list[Entry]]:
    """Remove every cache file in `folder` that no process holds. -> (removed, kept because in use)."""
    removed, kept = [], []
    with folder_lock(folder):
        for e in entries(folder):
            (removed if not e.in_use and remove_if_unused(e.path) else kept).append(e)
        for lock in folder.glob("*.u8.lock"):  # locks left without their file
            stem = lock.with_name(lock.name[: -len(".lock")])
            if NAME.fullmatch(stem.name) and not stem.exists():
                remove_if_unused(stem)
    return removed, kept


__all__ = ["cache_home", "image_cache_dir", "folder_lock", "hold", "make_room", "entries", "clear", "touch",
           "network_filesystem", "Entry", "MAGIC", "HEADER"]
