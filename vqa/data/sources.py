"""Where samples come from, and how the trainer and evaluation get batches from them.

A data set is a *source*: a folder split (VQA v2 / COCO / JSONL files: an indexed source, random access,
`SplitData`) or shards (webdataset tars or parquet files: a streamed source, `ShardSplit`). `--data` is a
folder (its splits: the official files, or sub-folders of shards as img2dataset writes them, `train/00000.tar`)
or a shard pattern (`shards/{00000..00099}.tar`, `https://...`, `pipe:...`), which is then the training split.
Both kinds turn into the same items (`vqa.data.dataset.ItemMaker`) and batches (`vqa.data.collate`), so the
model and the trainer never learn which source fed them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, Subset

from ..errors import DataError, VQAError
from .cache import open_image_cache
from .collate import Batch
from .dataset import ImageTextDataset, ItemMaker
from .formats import SplitData, corpus_batches, find_splits, load_split, pick_split
from .shards import SHARD_EXTS, Layout, ShardSplit, ShardStream, is_url, shard_texts

Source = SplitData | ShardSplit
_HUB_FILE = re.compile(r"^(?P<split>[A-Za-z0-9_.]+?)-\d{5}-of-\d{5}\.parquet$")


def is_pattern(data: str) -> bool:
    """A shard pattern or URL (or one shard file), rather than a data folder."""
    s = str(data)
    return is_url(s) or "{" in s or "::" in s or s.endswith(SHARD_EXTS)


def _shard_folders(root: Path) -> dict[str, Path | list[Path]]:
    """Shard splits of a folder: sub-folders holding .tar / .parquet files (img2dataset: one per set), and the
    Hub's `data/<split>-00000-of-00004.parquet` files."""
    out: dict[str, Path | list[Path]] = {}
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        if any(f.suffix in SHARD_EXTS for f in d.iterdir()):
            out[d.name] = d
    hub = root / "data"
    if hub.is_dir() and "data" in out:
        files: dict[str, list[Path]] = {}
        for f in sorted(hub.iterdir()):
            m = _HUB_FILE.match(f.name)
            if m:
                files.setdefault(m["split"], []).append(f)
        if files:
            del out["data"]
            out.update(files)
    return out


def list_splits(data: str | Path) -> list[str]:
    """The splits of `--data`: a folder's file splits and shard splits; a pattern is one split, 'train'."""
    if is_pattern(str(data)):
        return ["train"]
    root = Path(data)
    files = find_splits(root)  # raises for a missing folder
    return sorted(set(files) | set(_shard_folders(root)))


def resolve_splits(data: str, train_split: str | None, val_split: str | None) -> tuple[str, str | None]:
    """(train split, val split or None) of `--data`: the given names, or the ones `pick_split` finds
    (train2014 / val2014, train2017 / val2017, ...). With a pattern as --data, --val-split may be a pattern."""
    if is_pattern(str(data)):
        if val_split is not None and not is_pattern(val_split):
            raise DataError(f"--data is a shard pattern, so --val-split must be one too (got {val_split!r})")
        return "train", val_split
    splits = list_splits(data)
    train = train_split or pick_split(splits, "train", str(data), "--train-split")
    if train is None:
        found = ", ".join(splits) or "none"
        raise DataError(f"{data}: no training split (none is called train or train...); the splits found are: "
                        f"{found}; choose one with --train-split")
    val = val_split or pick_split([s for s in splits if s != train], "val", str(data), "--val-split")
    return train, val


def open_split(data: str | Path, split: str, **load_kw) -> Source:
    """The source of `split` in `--data` (or the pattern itself). load_kw go to `load_split` (folder files)."""
    if is_pattern(str(split)):
        return ShardSplit.from_pattern(str(split), str(split))
    if is_pattern(str(data)):
        return ShardSplit.from_pattern(split, str(data))
    root = Path(data)
    shards = _shard_folders(root) if root.is_dir() else {}
    if split in shards and split not in find_splits(root):
        where = shards[split]
        if isinstance(where, list):
            return ShardSplit.from_urls(split, f"{root / 'data'}/{split}-*.parquet", [str(p) for p in where])
        return ShardSplit.from_folder(split, where)
    if split not in find_splits(root) and shards:
        raise DataError(f"{data}: no split {split!r}; the splits found are: {', '.join(list_splits(root))}")
    return load_split(root, split, **load_kw)


def training_texts(source: Source) -> Iterator[list[str]]:
    """What the tokenizer is trained on, in batches (a streamed source: its first 200,000 samples)."""
    return shard_texts(source) if isinstance(source, ShardSplit) else corpus_batches(source)


# ---------------------------------------------------------------------------------------------------------
# batches for training


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


def worker_errors(batches: Iterator[Batch]) -> Iterator[Batch]:
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


class TrainBatches:
    """Per-rank micro-batches of an epoch from a saved position (epoch, images of its global order done), for
    either kind of source. One DataLoader for the whole run: its workers persist across epochs. For a folder
    split, `image_cache` / `image_cache_budget` are `--image-cache` / `--image-cache-budget`."""

    def __init__(self, source: Source, tokenizer, transform, max_len: int, tasks, questions_per_image: int,
                 captions_per_image: int, seed: int, layout: Layout, collate, pin: bool = False,
                 image_cache: str = "off", image_cache_budget: str = "25%", quiet: bool = False, block: int = 1000):
        self.layout, self.seed = layout, int(seed)
        self.images_per_step = layout.batch * layout.accum * layout.world
        gen = torch.Generator().manual_seed(seed * 1_000_003)  # not the global RNG: dropout masks stay exact
        common = dict(batch_size=layout.batch, collate_fn=collate, num_workers=layout.workers, pin_memory=pin,
                      persistent_workers=layout.workers > 0, generator=gen)
        self.sampler: EpochSampler | None = None
        self.cache = None
        if isinstance(source, ShardSplit):
            maker = ItemMaker(tokenizer, transform, max_len, questions_per_image, captions_per_image, train=True)
            self.dataset: Dataset = ShardStream(source, maker, seed=seed, layout=layout, train=True, block=block,
                                                tasks=tuple(tasks))
            self.num_images = len(source)
            self.steps_per_epoch = self.dataset.steps_per_epoch()
        else:
            from ..train.sampler import steps_in_epoch  # here: vqa.train imports this module

            self.dataset = ImageTextDataset(source, tokenizer, transform, max_len, tasks=tasks,
                                            questions_per_image=questions_per_image,
                                            captions_per_image=captions_per_image, train=True, seed=seed)
            self.num_images = len(self.dataset)
            self.steps_per_epoch = steps_in_epoch(self.num_images, self.images_per_step)
            if self.num_images:
                self.cache = open_image_cache(image_cache, image_cache_budget, self.dataset.images, transform.size,
                                              transform.fill, quiet=quiet)
            self.dataset.image_cache = self.cache
            self.sampler = EpochSampler()
            common["sampler"] = self.sampler
        self.loader = DataLoader(self.dataset, **common)

    def epoch(self, epoch: int, image_in_epoch: int) -> Iterator[Batch]:
        lay = self.layout
        if self.sampler is not None:
            from ..train.sampler import rank_order

            self.sampler.set(epoch, rank_order(self.num_images, epoch, self.seed, image_in_epoch, lay.rank,
                                               lay.world, lay.batch, lay.accum))
        else:
            self.dataset.set_position(epoch, image_in_epoch)
        return worker_errors(iter(self.loader))

    def close(self) -> None:
        it = getattr(self.loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self.loader._iterator = None


# ---------------------------------------------------------------------------------------------------------
# evaluation


def eval_dataset(source: Source, maker: ItemMaker, tasks, max_images: int | None = None) -> Dataset:
    """Every image of the split once (the first `max_images`), each with all its questions and captions."""
    if isinstance(source, ShardSplit):
        return ShardStream(source, maker, train=False, max_images=max_images, tasks=tuple(tasks))
    ds = ImageTextDataset(source, maker.tok, maker.transform, maker.max_len, tasks=tasks, train=False)
    if max_images is not None and max_images < len(ds):
        return Subset(ds, range(max_images))
    return ds


__all__ = ["Source", "is_pattern", "list_splits", "resolve_splits", "open_split", "training_texts",
           "EpochSampler", "TrainBatches", "eval_dataset", "worker_errors"]
