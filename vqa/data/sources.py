"""Where samples come from, and how the trainer and evaluation get batches from them.

A data set is a *source*: a folder split (VQA v2 / COCO / JSONL files: an indexed source, random access,
`SplitData`) or shards (webdataset tars or parquet files: a streamed source, `ShardSplit`). `--data` is a
folder (its splits: the official files, or sub-folders of shards as img2dataset writes them, `train/00000.tar`)
or a shard pattern (`shards/{00000..00099}.tar`, `https://...`, `pipe:...`), which is then the training split.
Both kinds turn into the same items (`vqa.data.dataset.ItemMaker`) and batches (`vqa.data.collate`), so the
model and the trainer never learn which source fed them (batches: `vqa.data.loader`). This module imports
no torch, so `vqa data info` starts fast and small.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from ..errors import DataError
from .readers.formats import find_splits, load_split, pick_split
from .readers.shards import SHARD_EXTS, ShardSplit, is_url, shard_texts
from .split import SplitData, corpus_batches

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


__all__ = ["Source", "is_pattern", "list_splits", "resolve_splits", "open_split", "training_texts"]
