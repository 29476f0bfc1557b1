"""Decoding a collection's images in DataLoader workers while the model runs.

A process (a rank) owns a contiguous range of the collection's positions (`rank_range`, as the training stream
deals an epoch). The range is cut into pieces (`ChunkSource._pieces`: a tar shard whole, a parquet shard at row
groups, image files `batch` at a time), dealt to the workers, each to the least loaded so far; a worker yields
its pieces as `Chunk`s of at most `batch` consecutive positions, which reach the main process out of position
order (the job writes their records in order: `vqa.inference.collection.job`).

A worker makes an image's model input as the Predictor and training do (its transform's `prepare`, uint8
[3, S, S]; for `vqa ask --point` from the picture read whole, whose size it keeps); an image that cannot be
decoded becomes an error, never an exception that stops the run. Positions whose key is already written (a
resumed run) are counted as `skipped` and not read.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ...data.images import load_image
from ...errors import VQAError
from .inputs import Collection, FileItem, ShardItems


@dataclass
class Loaded:
    """One position, read: its identity, and its model input or why there is none."""

    pos: int
    image: str
    shard: str | None = None
    question: str | None = None
    question_id: object = None
    pixels: torch.Tensor | None = None  # uint8 [3, S, S]
    error: str | None = None
    size: tuple[int, int] | None = None  # the picture's (width, height), read for pointing (`ChunkSource.sizes`)

    def ident(self) -> dict:
        """The record's identifying fields: image, and shard, question_id, question when there are."""
        fields = dict(shard=self.shard, question_id=self.question_id, question=self.question)
        return dict(image=self.image, **{k: v for k, v in fields.items() if v is not None})

    def key(self) -> tuple:
        return record_key(self.ident())


def record_key(rec: dict) -> tuple:
    """What tells one record from another: (shard, image, question_id or question; a point's phrase)."""
    q = rec.get("question_id")
    return rec.get("shard"), rec.get("image"), rec.get("question", rec.get("phrase")) if q is None else q


@dataclass
class Chunk:
    start: int = 0  # the positions [start, stop) it covers: its items and the ones skipped
    stop: int = 0
    items: list[Loaded] = field(default_factory=list)
    skipped: int = 0  # positions already written
    skipped_errors: int = 0  # of those, the ones whose record is an error


_DONE, _DONE_FAILED = "done", "done with an error"  # what a position already written yields instead of its item


def rank_range(n: int, rank: int, world: int) -> tuple[int, int]:
    """The contiguous positions rank `rank` of `world` owns."""
    return rank * n // world, (rank + 1) * n // world


def _deal(sizes: list[int], workers: int) -> list[int]:
    """The worker of each piece: the least loaded so far (the lowest number on a tie)."""
    load, owner = [0] * workers, []
    for n in sizes:
        w = min(range(workers), key=load.__getitem__)
        owner.append(w)
        load[w] += n
    return owner


class ChunkSource(IterableDataset):
    """The chunks of positions [lo, hi) of `collection`, each worker its pieces (the module docstring)."""

    def __init__(self, collection: Collection, lo: int, hi: int, batch: int, transform,
                 done: frozenset | set = frozenset(), failed: frozenset | set = frozenset(), sizes: bool = False):
        """`transform`: the Predictor's (`prepare(src, name=)`); `done`: the keys already written (skipped);
        `failed`: those of them whose record is an error; `sizes`: read each picture whole, as `Predictor.point`
        does, and keep its size (a point is in its pixels)."""
        self.units, self.starts = collection.units, collection.starts()
        self.lo, self.hi, self.batch = lo, hi, max(1, int(batch))
        self.transform, self.done, self.failed, self.sizes = transform, done, failed, sizes
        self.pieces = self._pieces()

    def _pieces(self) -> list[tuple[int, int]]:
        """[a, b) ranges of positions within [lo, hi): a tar shard whole, a parquet shard in runs of row groups,
        image files `batch` at a time."""
        out: list[tuple[int, int]] = []
        files: int | None = None  # where the open run of image files starts
        for unit, start in zip(self.units, self.starts, strict=True):
            a, b = max(self.lo, start), min(self.hi, start + unit.n)
            if a >= b:
                continue
            if isinstance(unit, FileItem):
                if files is None:
                    files = a
                if b - files >= self.batch:
                    out.append((files, b))
                    files = None
                continue
            if files is not None:
                out.append((files, a))
                files = None
            out += self._runs(unit, start, a, b)
        if files is not None:
            out.append((files, self.hi))
        return out

    def _runs(self, unit: ShardItems, start: int, a: int, b: int) -> list[tuple[int, int]]:
        """A shard's pieces: a tar whole (it is read from its start); a parquet shard cut at row groups (each read
        by one worker alone) into runs of at least `batch` positions, so several workers decode one shard."""
        out, at, edge = [], a, start
        for size in unit.split.shards[unit.index].groups:
            edge += size
            if a < edge < b and edge - at >= self.batch:
                out.append((at, edge))
                at = edge
        return [*out, (at, b)]

    def _skip(self, item: Loaded) -> str | None:
        """None when `item` is still to do, else what it yields instead (_DONE or _DONE_FAILED)."""
        key = item.key()
        if key not in self.done:
            return None
        return _DONE_FAILED if key in self.failed else _DONE

    def __len__(self) -> int:  # pieces: more workers than pieces would have nothing to read
        return len(self.pieces)

    def _decode(self, item: Loaded, src, name: str) -> Loaded:
        try:
            if self.sizes:  # whole, not drafted at a JPEG's smaller scale: the point is in the full picture's pixels
                src = load_image(src, max_pixels=self.transform.pre.max_pixels, name=name)
                item.size = src.size
            item.pixels = self.transform.prepare(src, name=name)
        except VQAError as e:
            item.error = str(e)
        except Exception as e:  # noqa: BLE001 -- a bad input must never stop the run
            item.error = f"{name}: unreadable image ({type(e).__name__}: {e})"
        return item

    def _positions(self, a: int, b: int) -> Iterator[tuple[int, Loaded | str]]:
        """(position, the item read, or _DONE / _DONE_FAILED when it was done before) for every position in
        [a, b), in order."""
        u = max(0, bisect.bisect_right(self.starts, a) - 1)
        for k in range(u, len(self.units)):
            unit, start = self.units[k], self.starts[k]
            if start >= b:
                return
            if isinstance(unit, FileItem):
                if start >= a:
                    item = Loaded(start, unit.key, None, unit.question, unit.question_id)
                    yield start, (self._skip(item) or self._decode(item, unit.path, unit.path))
                continue
            yield from self._shard(unit, start, a, b)

    def _shard(self, unit: ShardItems, start: int, a: int, b: int) -> Iterator[tuple[int, Loaded | str]]:
        first = max(a, start) - start
        stop = min(b, start + unit.n) - start
        if first >= stop:
            return
        at = first
        try:
            for s in unit.split.samples(unit.index, first):
                at = s.offset + 1
                if s.offset >= stop:
                    return
                pos = start + s.offset
                item = Loaded(pos, s.key, unit.url, unit.question)
                skip = self._skip(item)
                if skip:
                    yield pos, skip
                elif s.image is None:
                    item.error = f"{s.where}: {s.bad or 'no image'}"
                    yield pos, item
                else:
                    yield pos, self._decode(item, s.image, f"{s.where} ({s.ext})")
                if at >= stop:  # the piece's last sample: the next one is another reader's
                    return
        except VQAError as e:  # a truncated shard: its remaining positions get the error
            for o in range(at, stop):
                item = Loaded(start + o, f"#{o}", unit.url, unit.question, error=str(e))
                yield start + o, (self._skip(item) or item)

    def __iter__(self) -> Iterator[Chunk]:
        info = get_worker_info()
        w, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        owner = _deal([b - a for a, b in self.pieces], workers)
        for (a, b), who in zip(self.pieces, owner, strict=True):
            if who != w:
                continue
            chunk = Chunk(a, min(b, a + self.batch))
            for pos, item in self._positions(a, b):
                if pos >= chunk.stop:
                    yield chunk
                    chunk = Chunk(chunk.stop, min(b, chunk.stop + self.batch))
                if item in (_DONE, _DONE_FAILED):
                    chunk.skipped += 1
                    chunk.skipped_errors += item == _DONE_FAILED
                else:
                    chunk.items.append(item)
            yield chunk


def _as_is(x):
    return x


def _close(fds: tuple[int, ...], worker_id: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def chunk_loader(source: ChunkSource, workers: int, close_fds: tuple[int, ...] = ()) -> DataLoader:
    """The chunks, decoded by `workers` processes (0: in this one; at most one a piece). `close_fds`: descriptors a
    worker closes as it starts (the output's locks: a forked worker must not hold them after the job dies)."""
    workers = max(0, min(int(workers), len(source)))
    return DataLoader(source, batch_size=None, num_workers=workers, collate_fn=_as_is,
                      prefetch_factor=2 if workers else None,
                      worker_init_fn=functools.partial(_close, tuple(close_fds)) if workers else None)


__all__ = ["Loaded", "Chunk", "ChunkSource", "chunk_loader", "rank_range", "record_key"]
