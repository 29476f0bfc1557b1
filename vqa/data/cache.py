"""A node-wide image cache: the prepared (decoded, letterboxed) uint8 images of a split in one memory-mapped
file, filled on first use and shared by every DataLoader worker and every rank of the node.

Why a file: a per-process dict of decoded images is duplicated in every worker (and thrown away with them
each epoch), so it costs all the memory and brings none of the benefit. A memory-mapped file lives once in
the page cache, whoever reads it; workers and ranks that map it see each other's writes at once; and the
kernel may drop its pages under memory pressure (they are re-read from disk, still far cheaper than decoding
a JPEG). `auto` keeps the files in vqa's cache folder (`vqa.data.cache_folder`: $VQA_CACHE/images, else
~/.cache/vqa/images) within a total budget for the folder (`--image-cache-budget`, a share of RAM by default),
removing the least recently used files that no running process holds; a given path is used whatever its
size. A file is never reused for other images or settings: a header holds a fingerprint of the image list
(paths, sizes, modification times and inodes: a picture written over, or replaced by another file of the same
size and time, is another image) and of the whole preprocessing (`vqa.data.preprocess.Preprocess`: side,
resize, resample, fill colour, normalisation, pixel limit, JPEG draft rule), and a file whose header differs
is rebuilt (into a new file that replaces the name: a process that mapped the old one keeps it, and every
process checks the header when it maps the file, so none reads another run's slots).

Layout: a 4 KiB header (magic, JSON), N flag bytes (1 = slot filled) padded to 4 KiB, then N x 3 x S x S
bytes. A slot is written once, before its flag; two processes that fill the same slot write the same bytes.
Space is reserved with posix_fallocate when the file is made, so a full disk is a clear message then, never a
SIGBUS in the middle of an epoch.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ..errors import ConfigError
from .cache_folder import (
    HEADER,
    MAGIC,
    folder_lock,
    hold,
    image_cache_dir,
    make_room,
    network_filesystem,
    touch,
)
from .preprocess import Preprocess

VERSION = 2  # of the cache's layout and of `model_input`'s output: bump when either changes


def _align(n: int) -> int:
    return -(-n // 4096) * 4096


def parse_budget(text: str) -> int:
    """'25%' (of physical memory), '8G', '512M', or a number of bytes -> bytes."""
    t = str(text).strip().upper()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(%|[KMGT]I?B?|B)?", t)
    if not m:
        raise ConfigError(f"--image-cache-budget {text!r}: use a share of memory (25%) or a size (8G, 512M)")
    value, unit = float(m[1]), (m[2] or "B")
    if unit == "%":
        return int(value / 100 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return int(value * 1024 ** "BKMGT".index(unit[0]))


def fingerprint(images: Sequence[str], pre: Preprocess) -> str:
    """What makes the cache's bytes: every image's path, size, mtime and inode, in order, and the preprocessing."""
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps(dict(version=VERSION, preprocess=pre.key(), n=len(images))).encode())
    for p in images:
        try:
            file_stat = os.stat(p)
            h.update(f"{p}\0{file_stat.st_size}\0{file_stat.st_mtime_ns}\0{file_stat.st_ino}\n".encode())
        except OSError:
            h.update(f"{p}\0missing\n".encode())
    return h.hexdigest()


class ImageCache:
    """uint8 [N, 3, S, S] slots in a memory-mapped file. Picklable: a worker maps the file again by path."""

    def __init__(self, path: Path, n: int, size: int, fingerprint: str):
        self.path, self.n, self.size, self.fingerprint = Path(path), int(n), int(size), fingerprint
        self.slot = 3 * self.size * self.size
        self.data_offset = HEADER + _align(self.n)
        self._mm: mmap.mmap | None = None
        self._flags: np.ndarray | None = None
        self._data: np.ndarray | None = None
        self._hold = None  # this file's lock, held shared while the cache is open: the file is in use
        self.stale = False  # the file at `path` is no longer the one this cache was opened on
        self.quiet = False

    @property
    def nbytes(self) -> int:
        return self.data_offset + self.n * self.slot

    # ---- making or reusing the file (under a lock: ranks of a node race to it) ----
    @classmethod
    def open(cls, path: str | Path, images: Sequence[str], pre: Preprocess,
             quiet: bool = False, budget: int | None = None) -> ImageCache | None:
        """The cache file at `path`, made (or rebuilt) unless it is whole and made for these images and
        settings, and held (in use) until `close`. With a `budget` (bytes for the whole folder), the least
        recently used files of the folder that no process holds are removed to fit this one; None (said once)
        when the files in use leave no room."""
        path = Path(path)
        digest = fingerprint(images, pre)
        cache = cls(path, len(images), pre.size, digest)
        cache.quiet = quiet
        with folder_lock(path.parent):
            valid = cache._read_header() is not None
            if budget is not None:
                fits, held = make_room(path.parent, path, cache.nbytes, budget)
                if not fits:
                    if not quiet:
                        print(f"vqa: image cache off: the files of {path.parent} in use by running processes "
                              f"take {held / 2**30:.2f} GiB of the budget of {budget / 2**30:.2f} GiB, and "
                              f"this one needs {cache.nbytes / 2**30:.2f} GiB (--image-cache-budget)",
                              file=sys.stderr)
                    return None
            if not valid:
                if path.exists() and not quiet:
                    print(f"vqa: image cache {path} was made for other images or settings: rebuilding it",
                          file=sys.stderr)
                cache._create()
            cache._hold = hold(path)
            touch(path)
        return cache

    def close(self) -> None:
        """Unmap the file and let it go (it may then be evicted)."""
        self._flags = self._data = None
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # a tensor still views it: the mapping goes with it
                pass
            self._mm = None
        if self._hold is not None:
            self._hold.close()
            self._hold = None

    def _header_bytes(self) -> bytes:
        meta = json.dumps(dict(fingerprint=self.fingerprint, n=self.n, size=self.size)).encode()
        return (MAGIC + meta + b"\n").ljust(HEADER, b"\0")

    def _read_header(self) -> dict | None:
        """The header if the file exists, is whole and was made for these images and settings; else None."""
        try:
            with open(self.path, "rb") as f:
                raw = f.read(HEADER)
                f.seek(0, os.SEEK_END)
                whole = f.tell() == self.nbytes
        except OSError:
            return None
        return json.loads(raw[len(MAGIC):].split(b"\n", 1)[0]) if raw == self._header_bytes() and whole else None

    def _create(self) -> None:
        tmp = self.path.with_name(f"{self.path.name}.tmp{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                f.write(self._header_bytes())
                f.truncate(self.nbytes)  # flags start at 0 (empty slots); the data is sparse until written
                try:
                    os.posix_fallocate(f.fileno(), 0, self.nbytes)
                except OSError as e:
                    raise ConfigError(f"image cache {self.path}: cannot reserve {self.nbytes / 2**30:.1f} GiB "
                                      f"({e.strerror}); free space there, give another --image-cache PATH, or "
                                      "--image-cache off") from None
            os.replace(tmp, self.path)  # whoever still maps an old file keeps its own (unlinked) copy
        finally:
            tmp.unlink(missing_ok=True)

    # ---- slots ----
    def _map(self) -> bool:
        """Map the file if it is still the one made for these images (checked on the mapped file itself: another
        run may have rebuilt it under the same name since); else the cache is off in this process."""
        if self.stale:
            return False
        try:
            with open(self.path, "r+b") as f:
                if f.read(HEADER) != self._header_bytes() or os.fstat(f.fileno()).st_size != self.nbytes:
                    raise OSError("made for other images or settings since")
                self._mm = mmap.mmap(f.fileno(), self.nbytes)
        except OSError as e:
            self.stale = True
            if not self.quiet:
                print(f"vqa: image cache {self.path} is no longer this run's ({e.strerror or e}): images are "
                      "decoded without it in this process", file=sys.stderr)
            return False
        self._flags = np.frombuffer(self._mm, dtype=np.uint8, count=self.n, offset=HEADER)
        self._data = np.frombuffer(self._mm, dtype=np.uint8, count=self.n * self.slot,
                                   offset=self.data_offset).reshape(self.n, 3, self.size, self.size)
        return True

    def get(self, i: int) -> torch.Tensor | None:
        """Slot i as a new uint8 tensor [3, S, S], or None if not filled yet."""
        if self._mm is None and not self._map():
            return None
        if not self._flags[i]:
            return None
        return torch.from_numpy(self._data[i].copy())

    def put(self, i: int, x: torch.Tensor) -> None:
        if self._mm is None and not self._map():
            return
        self._data[i] = x.numpy()
        self._flags[i] = 1

    def filled(self) -> int:
        if self._mm is None and not self._map():
            return 0
        return int(np.count_nonzero(self._flags))

    def __getstate__(self) -> dict:
        # a worker maps the file again (checking its header); the process that opened it holds it
        return {k: v for k, v in self.__dict__.items() if k not in ("_mm", "_flags", "_data", "_hold")} | dict(
            _mm=None, _flags=None, _data=None, _hold=None)


def default_cache_path(images: Sequence[str], pre: Preprocess) -> Path:
    """In vqa's cache folder, named by the image list and the whole preprocessing, so runs on the same images
    with the same preprocessing share it and runs with another never share a file."""
    h = hashlib.blake2b("\n".join([*images, pre.key()]).encode(), digest_size=8).hexdigest()
    return image_cache_dir() / f"{h}-{pre.size}px.u8"


def open_image_cache(setting: str, budget: str, images: Sequence[str], pre: Preprocess,
                     quiet: bool = False) -> ImageCache | None:
    """The cache `--image-cache` asks for: None for 'off'; for 'auto' a file in vqa's cache folder, the folder
    kept within the budget (None, said once, when the file alone is over it, when files in use leave no room, or
    when the folder is on a network filesystem); a path: that file, whatever its size."""
    setting = str(setting or "off")
    if setting == "off" or not images:
        return None
    size = pre.size
    need = HEADER + _align(len(images)) + len(images) * 3 * size * size
    if setting == "auto":
        limit = parse_budget(budget)
        if need > limit:
            if not quiet:
                print(f"vqa: image cache off: {len(images):,} images at {size} px need {need / 2**30:.2f} GiB, over "
                      f"the budget of {limit / 2**30:.2f} GiB (--image-cache-budget {budget}; --image-cache PATH "
                      "uses a file whatever its size)", file=sys.stderr)
            return None
        path = default_cache_path(images, pre)
        remote = network_filesystem(path.parent)
        if remote:
            if not quiet:
                print(f"vqa: image cache off: {path.parent} is on a network filesystem ({remote}), which ranks "
                      "on several nodes could share; set VQA_CACHE to a folder on a local disk", file=sys.stderr)
            return None
        return ImageCache.open(path, images, pre, quiet=quiet, budget=limit)
    return ImageCache.open(Path(setting), images, pre, quiet=quiet)


__all__ = ["ImageCache", "open_image_cache", "parse_budget", "fingerprint", "default_cache_path"]
