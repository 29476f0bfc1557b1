"""Decoding a collection's images in DataLoader workers while the model runs.

A process (a rank) owns a contiguous range [lo, hi) of the collection's positions, as the training stream
deals an epoch's sequence to ranks (`vqa.data.stream`): rank r of W gets [r N / W, (r + 1) N / W). The range
is cut into chunks of `batch` positions; DataLoader worker w reads chunks w, w + workers, w + 2 workers, ...
and yields one `Chunk` for each (empty when all of it was done before), so the loader, which takes the
workers' outputs in turn, hands the chunks over in position order. A shard is read in file order from the
first position a worker needs; samples of other workers' chunks are passed over without being decoded.

A worker makes an image's model input as the Predictor and training do (the Predictor's transform: its
`prepare` is `vqa.data.preprocess.model_input` with the model's preprocessing and the Predictor's pixel limit),
uint8 [3, S, S], so a batch reaches the model ready to normalise; an image that cannot be
decoded becomes an error, never an exception that stops the run. Positions whose key is already written (a
resumed run) are counted as `skipped` and not read (and as `skipped_errors` when that record is an error).
"""

from __future__ import annotations

import bisect
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ..errors import VQAError
from .collection import Collection, FileItem, ShardItems


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

    def ident(self) -> dict:
        """The record's identifying fields: image, shard, question_id, question."""
        out: dict = dict(image=self.image)
        if self.shard is not None:
            out["shard"] = self.shard
        if self.question_id is not None:
            out["question_id"] = self.question_id
        if self.question is not None:
            out["question"] = self.question
        return out

    def key(self) -> tuple:
        return record_key(self.ident())


def record_key(rec: dict) -> tuple:
    """What tells one record from another: (shard, image, question_id or question)."""
    q = rec.get("question_id")
    return rec.get("shard"), rec.get("image"), rec.get("question") if q is None else q


@dataclass
class Chunk:
    items: list[Loaded] = field(default_factory=list)
    skipped: int = 0  # positions already written
    skipped_errors: int = 0  # of those, the ones whose record is an error


_DONE, _DONE_FAILED = "done", "done with an error"  # what a position already written yields instead of its item


def rank_range(n: int, rank: int, world: int) -> tuple[int, int]:
    """The contiguous positions rank `rank` of `world` owns."""
    return rank * n // world, (rank + 1) * n // world


class ChunkSource(IterableDataset):
    """The chunks of positions [lo, hi) of `collection`, each worker its share (the module docstring)."""

    def __init__(self, collection: Collection, lo: int, hi: int, batch: int, transform,
                 done: frozenset | set = frozenset(), failed: frozenset | set = frozenset()):
        """`transform`: the Predictor's (`prepare(src, name=)`); `done`: the keys already written (skipped);
        `failed`: those of them whose record is an error."""
        self.units, self.starts = collection.units, collection.starts()
        self.lo, self.hi, self.batch = lo, hi, max(1, int(batch))
        self.transform, self.done, self.failed = transform, done, failed

    def _skip(self, item: Loaded) -> str | None:
        """None when `item` is still to do, else what it yields instead (_DONE or _DONE_FAILED)."""
        key = item.key()
        if key not in self.done:
            return None
        return _DONE_FAILED if key in self.failed else _DONE

    def __len__(self) -> int:  # chunks
        return -(-(self.hi - self.lo) // self.batch)

    def _decode(self, item: Loaded, src, name: str) -> Loaded:
        try:
            item.pixels = self.transform.prepare(src, name=name)
        except VQAError as e:
            item.error = str(e)
        except Exception as e:  # noqa: BLE001 -- a bad input must never stop the run
            item.error = f"{name}: unreadable image ({type(e).__name__}: {e})"
        return item

    def _positions(self, mine) -> Iterator[tuple[int, Loaded | str]]:
        """(position, the item read, or _DONE / _DONE_FAILED when it was done before) for the positions in
        [lo, hi) for which `mine(position)` holds, in order."""
        u = max(0, bisect.bisect_right(self.starts, self.lo) - 1)
        for k in range(u, len(self.units)):
            unit, start = self.units[k], self.starts[k]
            if start >= self.hi:
                return
            if isinstance(unit, FileItem):
                if start >= self.lo and mine(start):
                    item = Loaded(start, unit.key, None, unit.question, unit.question_id)
                    yield start, (self._skip(item) or self._decode(item, unit.path, unit.path))
                continue
            yield from self._shard(unit, start, mine)

    def _shard(self, unit: ShardItems, start: int, mine) -> Iterator[tuple[int, Loaded | str]]:
        first = max(self.lo, start) - start
        stop = min(self.hi, start + unit.n) - start
        wanted = [o for o in range(first, stop) if mine(start + o)]
        if not wanted:
            return
        at = wanted[0]
        try:
            for s in unit.split.samples(unit.index, wanted[0]):
                at = s.offset + 1
                if s.offset >= stop:
                    return
                pos = start + s.offset
                if not mine(pos):
                    continue
                item = Loaded(pos, s.key, unit.url, unit.question)
                skip = self._skip(item)
                if skip:
                    yield pos, skip
                elif s.image is None:
                    item.error = f"{s.where}: {s.bad or 'no image'}"
                    yield pos, item
                else:
                    yield pos, self._decode(item, s.image, f"{s.where} ({s.ext})")
        except VQAError as e:  # a truncated shard: its remaining positions get the error
            for o in range(at, stop):
                if mine(start + o):
                    item = Loaded(start + o, f"#{o}", unit.url, unit.question, error=str(e))
                    yield start + o, (self._skip(item) or item)

    def __iter__(self) -> Iterator[Chunk]:
        info = get_worker_info()
        w, workers = (info.id, info.num_workers) if info is not None else (0, 1)

        def chunk_of(pos: int) -> int:
            return (pos - self.lo) // self.batch

        def mine(pos: int) -> bool:
            return chunk_of(pos) % workers == w

        current, chunk = None, Chunk()
        for pos, item in self._positions(mine):
            c = chunk_of(pos)
            if current is not None and c != current:
                yield chunk
                chunk = Chunk()
            current = c
            if item in (_DONE, _DONE_FAILED):
                chunk.skipped += 1
                chunk.skipped_errors += item == _DONE_FAILED
            else:
                chunk.items.append(item)
        if current is not None:
            yield chunk


def _as_is(x):
    return x


def _close(fds: tuple[int, ...], worker_id: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def chunk_loader(source: ChunkSource, workers: int, close_fds: tuple[int, ...] = ()) -> DataLoader:
    """The chunks in position order, decoded by `workers` processes (0: in this one). `close_fds`: descriptors a
    worker closes as it starts (the output's locks: a forked worker must not hold them after the job dies)."""
    workers = max(0, min(int(workers), len(source)))
    return DataLoader(source, batch_size=None, num_workers=workers, collate_fn=_as_is,
                      prefetch_factor=2 if workers else None,
                      worker_init_fn=functools.partial(_close, tuple(close_fds)) if workers else None)


__all__ = ["Loaded", "Chunk", "ChunkSource", "chunk_loader", "rank_range", "record_key"]
