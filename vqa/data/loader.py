"""Batches from a source (`vqa.data.sources`) for the trainer (`TrainingMicroBatches`) and for evaluation
(`eval_dataset`): one DataLoader per run, persistent workers, the epoch in every index, the shared image cache
for folder splits, `ShardStream` for shards."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, Subset

from ..errors import VQAError
from .cache import open_image_cache
from .collate import ImageTextBatch
from .dataset import ImageTextDataset, ItemMaker
from .lengths import say, split_cuts
from .readers.shards import ShardSplit
from .sources import Source
from .stream import Layout, ShardStream
from .unreadable import UnreadablePictures


class EpochSampler(Sampler):
    """Yields (epoch, index) pairs: a persistent worker's dataset copy never sees `set_epoch`, so the epoch
    travels with every index. The main process sets the order before each pass."""

    def __init__(self) -> None:
        self.epoch, self.order = 0, []

    def set(self, epoch: int, order: list[int]) -> None:
        self.epoch, self.order = int(epoch), order

    def __iter__(self):
        return ((self.epoch, i) for i in self.order)

    def __len__(self) -> int:
        return len(self.order)


def worker_errors(batches: Iterator[ImageTextBatch]) -> Iterator[ImageTextBatch]:
    """Re-raise a VQAError from a DataLoader worker with its own message (torch adds the worker's traceback)."""
    try:
        yield from batches
    except VQAError as e:
        msg = str(e)
        if "Original Traceback" in msg:
            last = msg.strip().splitlines()[-1]
            msg = last.split(": ", 1)[1] if ": " in last else last
            raise type(e)(msg) from None
        raise


class TrainingMicroBatches:
    """Per-rank micro-batches of an epoch from a saved position (epoch, images of its global order done), for
    either kind of source. One DataLoader for the whole run: its workers persist across epochs. For a folder
    split, `image_cache` / `image_cache_budget` are `--image-cache` / `--image-cache-budget`, and
    `max_unreadable` is the share of its pictures that may be unreadable (`vqa.data.unreadable`; a shard
    stream skips every bad sample with a line of its own); `regions`: the grounding loss's targets."""

    def __init__(self, source: Source, tokenizer, transform, max_len: int, tasks, questions_per_image: int,
                 captions_per_image: int, seed: int, layout: Layout, collate, pin: bool = False,
                 image_cache: str = "off", image_cache_budget: str = "25%", quiet: bool = False, block: int = 1000,
                 max_unreadable: float = 0.01, regions=None):
        self.layout, self.seed = layout, int(seed)
        self.images_per_step = layout.batch * layout.accum * layout.world
        gen = torch.Generator().manual_seed(seed * 1_000_003)  # not the global RNG: dropout masks stay exact
        common = dict(batch_size=layout.batch, collate_fn=collate, num_workers=layout.workers, pin_memory=pin,
                      persistent_workers=layout.workers > 0, generator=gen)
        self.sampler: EpochSampler | None = None
        self.cache = None
        if not quiet:  # the texts it will cut, said once, before the first step
            for text in split_cuts(tokenizer, max_len, source, tasks):
                say(text)
        if isinstance(source, ShardSplit):
            maker = ItemMaker(tokenizer, transform, max_len, questions_per_image, captions_per_image, train=True)
            self.dataset: Dataset = ShardStream(source, maker, seed=seed, layout=layout, train=True, block=block,
                                                tasks=tuple(tasks))
            self.num_images = len(source)
            self.steps_per_epoch = self.dataset.steps_per_epoch()
        else:
            from .sampler import steps_in_epoch  # here: vqa.train imports this module

            self.dataset = ImageTextDataset(source, tokenizer, transform, max_len, tasks=tasks,
                                            questions_per_image=questions_per_image,
                                            captions_per_image=captions_per_image, train=True, seed=seed)
            self.num_images = len(self.dataset)
            self.dataset.unreadable = UnreadablePictures(self.num_images, max_unreadable, world=layout.world)
            self.steps_per_epoch = steps_in_epoch(self.num_images, self.images_per_step)
            if self.num_images:
                self.cache = open_image_cache(image_cache, image_cache_budget, self.dataset.images, transform.pre,
                                              quiet=quiet)
            self.dataset.image_cache = self.cache
            self.sampler = EpochSampler()
            common["sampler"] = self.sampler
        if regions is not None:  # training's grounded tokens (`vqa.data.regions`)
            (maker if isinstance(source, ShardSplit) else self.dataset.maker).regions = regions
        self.loader = DataLoader(self.dataset, **common)

    def epoch(self, epoch: int, image_in_epoch: int) -> Iterator[ImageTextBatch]:
        lay = self.layout
        if self.sampler is not None:
            from .sampler import rank_order

            self.sampler.set(epoch, rank_order(self.num_images, epoch, self.seed, image_in_epoch, lay.rank,
                                               lay.world, lay.batch, lay.accum))
        else:
            self.dataset.set_position(epoch, image_in_epoch)
        return worker_errors(iter(self.loader))

    def agree_unreadable(self, device) -> None:
        """Every rank at the same step: the unreadable pictures of all ranks against --max-unreadable
        (`UnreadablePictures.agree`; a shard stream has no tally)."""
        tally = unreadable_of(self.dataset)
        if tally is not None:
            tally.agree(device)

    def close(self) -> None:
        it = getattr(self.loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self.loader._iterator = None
        if self.cache is not None:
            self.cache.close()  # no longer in use: the cache folder may evict it


# ---------------------------------------------------------------------------------------------------------
# evaluation


def eval_dataset(source: Source, maker: ItemMaker, tasks, max_images: int | None = None, rank: int = 0,
                 world: int = 1, max_unreadable: float | None = None) -> Dataset:
    """Every image of the split once (the first `max_images`), each with all its questions and captions;
    with several ranks, this rank's share of a folder split (image i to rank i % world). A shard split is
    streamed whole by rank 0 (the others get nothing). `max_unreadable`: skip a folder split's unreadable
    pictures up to that share of them (evaluation during training); None: stop at the first."""
    if isinstance(source, ShardSplit):
        if rank != 0:
            return Subset(ImageTextDataset.__new__(ImageTextDataset), [])  # an empty dataset
        return ShardStream(source, maker, train=False, max_images=max_images, tasks=tuple(tasks))
    ds = ImageTextDataset(source, maker.tok, maker.transform, maker.max_len, tasks=tasks, train=False)
    n = len(ds) if max_images is None else min(max_images, len(ds))
    if max_unreadable is not None:
        ds.unreadable = UnreadablePictures(n, max_unreadable, what="evaluation", world=world)
    if world > 1 or n < len(ds):
        return Subset(ds, range(rank, n, world))
    return ds


def unreadable_of(ds: Dataset) -> UnreadablePictures | None:
    """The tally of a folder split's dataset (or of the one a Subset takes from); None elsewhere."""
    return getattr(ds.dataset if isinstance(ds, Subset) else ds, "unreadable", None)


__all__ = ["EpochSampler", "TrainingMicroBatches", "eval_dataset", "unreadable_of", "worker_errors"]
