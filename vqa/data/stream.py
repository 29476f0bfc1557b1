"""`ShardStream`: a shard split's items dealt to (rank, DataLoader worker) streams, as `vqa.data.readers.shards`
describes: equal contiguous ranges of the epoch's sequence, block-shuffled, resumable at a saved position."""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from ..errors import DataError, InputError
from .dataset import ItemMaker, item_generators
from .readers.shards import Sample, ShardSplit


def epoch_shard_order(n_shards: int, epoch: int, seed: int, shuffle: bool) -> list[int]:
    if not shuffle:
        return list(range(n_shards))
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n_shards, generator=g).tolist()


def stream_length(n: int, streams: int, batch: int, accum: int) -> int:
    """Samples per stream per epoch: equal for all, a whole number of batches, and per rank a whole number of
    steps (accum micro-batches)."""
    return n // (streams * batch * accum) * batch * accum


@dataclass
class Layout:
    """Who reads what: `world` ranks x `workers` DataLoader workers (0 counts as 1), batch, accum."""

    rank: int = 0
    world: int = 1
    workers: int = 0
    batch: int = 1
    accum: int = 1

    @property
    def per_rank(self) -> int:
        return max(1, self.workers)

    @property
    def streams(self) -> int:
        return self.world * self.per_rank


class ShardStream(IterableDataset):
    """The items of a shard split, dealt to (rank, worker) streams as the module docstring says.

    Training: call `set_position(epoch, image_in_epoch)` before iterating (the value lives in shared memory,
    so persistent workers see it at the start of every pass). Evaluation (train=False): every sample in file
    order, once, from one stream, up to `max_images`."""

    def __init__(self, split: ShardSplit, maker: ItemMaker, seed: int = 0, layout: Layout | None = None,
                 train: bool = True, block: int = 1000, max_images: int | None = None,
                 tasks: tuple[str, ...] = ("vqa", "caption")):
        self.split, self.maker, self.seed, self.train = split, maker, int(seed), bool(train)
        self.tasks = tuple(tasks)
        self.layout = layout or Layout()
        self.block, self.max_images = int(block), max_images
        self.n = len(split)
        self.length = stream_length(self.n, self.layout.streams, self.layout.batch, self.layout.accum) if train \
            else min(self.n, max_images if max_images is not None else self.n)
        self._position = torch.zeros(2, dtype=torch.int64).share_memory_()  # [epoch, images of the epoch done]
        self._bad = 0

    def steps_per_epoch(self) -> int:
        lay = self.layout
        return lay.per_rank * (self.length // lay.batch) // lay.accum

    def set_position(self, epoch: int, image_in_epoch: int) -> None:
        self._position[0], self._position[1] = int(epoch), int(image_in_epoch)

    def _stream(self) -> tuple[int, int]:
        """(this stream's number, output samples it has already delivered this epoch)."""
        lay = self.layout
        info = get_worker_info()
        w = info.id if info is not None else 0
        # micro-batches this rank consumed; batch i of an epoch came from the stream of role i % workers. A pass
        # always starts with worker 0, so after c batches worker w plays role (w + c) % workers: the next batch
        # comes from the role whose turn it is, as in the uninterrupted epoch
        consumed = int(self._position[1]) // (lay.batch * lay.world)
        role = (w + consumed) % lay.per_rank
        done = (consumed - role + lay.per_rank - 1) // lay.per_rank if consumed > role else 0
        return lay.rank * lay.per_rank + role, done * lay.batch

    def _pieces(self, epoch: int, lo: int, hi: int) -> Iterator[tuple[int, int, int]]:
        """(shard number, first, stop) pieces covering positions [lo, hi) of the epoch's sequence."""
        order = epoch_shard_order(len(self.split.shards), epoch, self.seed, self.train)
        pos = 0
        for j in order:
            n = self.split.shards[j].n
            a, b = max(lo, pos), min(hi, pos + n)
            if a < b:
                yield j, a - pos, b - pos
            pos += n
            if pos >= hi:
                return

    def _read(self, epoch: int, lo: int, hi: int) -> Iterator[Sample]:
        for j, a, b in self._pieces(epoch, lo, hi):
            for s in self.split.samples(j, a):
                if s.offset >= b:
                    break
                yield s

    def samples(self) -> Iterator[tuple[int, Sample]]:
        """(epoch, sample) in this stream's order for the current position."""
        if not self.train:
            info = get_worker_info()
            if info is not None and info.num_workers > 1:
                raise DataError("evaluation over shards reads them in one stream: use 0 or 1 loader workers")
            for s in self._read(0, 0, self.length):
                yield 0, s
            return
        epoch = int(self._position[0])
        k, done = self._stream()
        lo = k * self.length
        b = done // self.block  # the block the stream stopped in is read again, its permutation continued
        reader = self._read(epoch, lo + b * self.block, lo + self.length)
        while True:
            buf = list(itertools.islice(reader, self.block))
            if not buf:
                return
            perm = np.random.default_rng([self.seed, epoch, k, b]).permutation(len(buf))
            skip = done - b * self.block if done > b * self.block else 0
            for i in perm[skip:].tolist():
                yield epoch, buf[i]
            b += 1

    def __iter__(self) -> Iterator[dict]:
        for epoch, s in self.samples():
            yield self.item(epoch, s)

    def item(self, epoch: int, s: Sample) -> dict:
        rng, g = item_generators(self.seed, epoch, (_shard_key(s.shard), s.offset))
        image = None
        if s.bad is None:
            try:
                image = self.maker.transform.prepare(s.image, name=f"{s.where} ({s.ext})")
            except InputError as e:
                s.bad = f"unreadable image: {e}"
        if s.bad is not None:
            self._bad += 1
            print(f"vqa: skipped {s.where}: {s.bad} (bad samples in this reader: {self._bad})", file=sys.stderr)
            return self.maker.skipped(g)
        qs, caps = s.records()
        qs, caps = (qs if "vqa" in self.tasks else []), (caps if "caption" in self.tasks else [])
        rows = self.maker.rows(rng, len(qs), qs.__getitem__, len(caps), caps.__getitem__, s.captions)
        texts = [t for q in qs for t in (q.question, q.multiple_choice_answer, *q.answers)] + s.captions  # flip guard
        return self.maker.item(image, rows, texts, g)


def _shard_key(url: str) -> int:
    """A stable number for a shard's name (its samples' random draws must not depend on the shard order)."""
    import hashlib

    return int.from_bytes(hashlib.blake2b(os.path.basename(url).encode(), digest_size=7).digest(), "little")


__all__ = ["ShardStream", "Layout", "stream_length", "epoch_shard_order"]
