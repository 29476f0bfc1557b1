"""`vqa data`: build a built-in synthetic set (`vqa data shapes`, `scenes`, `glyphs`, `corpus`),
inspect a data set (`vqa data info`), copy the shipped sample pictures (`vqa data samples --out DIR`), write
one as shards (`vqa data convert SRC --to webdataset|parquet OUT`), or list or clear
the image cache folder (`vqa data cache [--clear]`)."""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np

from ..options import check_out_folder
from .split import skipped_summary

SETS = {
    "shapes": "the built-in Shapes set",
    "scenes": "the built-in Scenes set, a second synthetic set to check a training recipe on",
    "glyphs": "the built-in Glyphs set: written characters, pictures unlike the pretraining corpus",
    "corpus": "the pretraining corpus of `vqa pretrain`: broader scenes, dense captions",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    for name, what in SETS.items():
        p = sub.add_parser(name, help=f"generate {what} (VQA v2 + COCO captions layout)")
        p.add_argument("--out", required=True, type=Path, help="output folder")
        p.add_argument("--train", type=int, default=10000, help="training images (default 10000)")
        p.add_argument("--val", type=int, default=1000, help="validation images (default 1000)")
        p.add_argument("--size", type=int, default=64, help="image side in pixels (default 64)")
        p.add_argument("--seed", type=int, default=0, help="random seed; the same seed gives identical files")
        p.add_argument("--questions-per-family", type=int, default=1,
                       help="questions per image per family (6 families; default 1)")
        p.add_argument("--workers", type=int, default=None, help="rendering processes (default: CPU count, max 8)")
        p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
        if name == "corpus":
            p.add_argument("--things", type=Path, default=None, metavar="DIR",
                           help="a things folder (scripts/make_things.py): part of the pictures show its things")
            p.add_argument("--things-share", type=float, default=0.3, metavar="X",
                           help="with --things, the share of pictures drawn from it (default 0.3)")
    p = sub.add_parser("samples", help="copy the sample pictures shipped with vqa (and samples.json, their "
                       "questions) into a folder, for vqa ask / vqa caption")
    p.add_argument("--out", required=True, type=Path, help="output folder")
    p = sub.add_parser("info", help="list a data set's splits with their record (or shard) counts")
    p.add_argument("dir", help="data folder, or a shard pattern (shards/{00000..00009}.tar)")
    p.add_argument("--split", action="append", help="only this split (repeatable)")
    p.add_argument("--check-images", action="store_true",
                   help="also decode every image and report bad ones (shards: read every sample)")
    p = sub.add_parser("convert", help="write a data set's splits as webdataset (.tar) or parquet shards")
    p.add_argument("src", help="data folder (VQA v2 / COCO / JSONL / Shapes, or shards), or a shard pattern")
    p.add_argument("out", type=Path, help="output folder: one sub-folder of shards per split")
    p.add_argument("--to", required=True, choices=("webdataset", "parquet"), help="shard format")
    p.add_argument("--split", action="append", help="only this split (repeatable; default: all)")
    p.add_argument("--shard-size", type=int, default=1000, help="images per shard (default 1000)")
    p = sub.add_parser("cache", help="list the image cache folder ($VQA_CACHE/images, else ~/.cache/vqa/images) "
                       "or clear it")
    p.add_argument("--clear", action="store_true",
                   help="remove every cache file that no running process holds (those in use are kept, listed)")


def run(args: argparse.Namespace) -> int:
    synthetic = dict.fromkeys(SETS, run_synthetic)
    return {**synthetic, "info": run_info, "convert": run_convert, "cache": run_cache,
            "samples": run_samples}[args.data_command](args)


def run_samples(args: argparse.Namespace) -> int:
    from .samples import copy_samples

    copied = copy_samples(args.out)
    print(f"{args.out}: {len(copied)} sample pictures ({', '.join(p.name for p in copied)}) and samples.json")
    return 0


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def run_cache(args: argparse.Namespace) -> int:
    """`vqa data cache`: the image cache files, least recently used first; `--clear` removes those not in use."""
    from .cache_folder import clear, entries, folder_lock, image_cache_dir

    folder = image_cache_dir()
    if args.clear:
        removed, kept = clear(folder)
        print(f"{folder}: removed {len(removed)} file(s), {_size(sum(e.bytes for e in removed))}")
        for e in kept:
            print(f"  kept {e.path.name} ({_size(e.bytes)}): in use by a running process")
        return 0
    if not folder.is_dir():
        print(f"{folder}: empty (no image cache made yet)")
        return 0
    with folder_lock(folder):
        found = entries(folder, details=True)
    print(f"{folder}: {len(found)} file(s), {_size(sum(e.bytes for e in found))}")
    for e in found:
        what = (f"{e.images:,} images at {e.side} px, {e.filled:,} filled" if e.images is not None
                else "unreadable header")
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used))
        print(f"  {e.path.name}  {_size(e.bytes):>10s}  {what}  last used {used}"
              + ("  in use" if e.in_use else ""))
    return 0


def run_convert(args: argparse.Namespace) -> int:
    from .convert import convert
    from .sources import list_splits, open_split

    if args.shard_size < 1:
        from ..errors import ConfigError

        raise ConfigError(f"--shard-size must be >= 1, got {args.shard_size}")
    check_out_folder("OUT", args.out)
    for split in args.split or list_splits(args.src):
        t0 = time.perf_counter()
        src = open_split(args.src, split)
        n, shards = convert(src, split, args.to, args.out / split, args.shard_size)
        print(f"{split}: {n} images in {shards} {args.to} shards -> {args.out / split} "
              f"({time.perf_counter() - t0:.1f} s)")
    return 0


def run_synthetic(args: argparse.Namespace) -> int:
    """`vqa data shapes` / `scenes` / `glyphs` / `corpus`: build the set, then print its counts, answers and
    priors."""
    from .synthetic import corpus, glyphs, scenes, shapes
    from .synthetic.generator import FAMILIES, generate

    spec = {"shapes": shapes.SHAPES_SET, "scenes": scenes.SCENES_SET, "glyphs": glyphs.GLYPHS_SET,
            "corpus": corpus.CORPUS_SET}[args.data_command]
    check_out_folder("--out", args.out)
    if getattr(args, "things", None) is not None:
        from ..errors import ConfigError
        from .synthetic.corpus_things import with_things

        if not 0 < args.things_share <= 1:
            raise ConfigError(f"--things-share must be in (0, 1], got {args.things_share}")
        spec = with_things(args.things, args.things_share)
    t0 = time.perf_counter()
    priors = generate(spec, args.out, n_train=args.train, n_val=args.val, size=args.size, seed=args.seed,
                      progress=not args.no_progress, workers=args.workers,
                      questions_per_family=args.questions_per_family)
    seconds = time.perf_counter() - t0
    info = json.loads((args.out / f"{spec.prefix}_info.json").read_text())
    for split, c in info["counts"].items():
        print(f"{split}: {c['images']} images, {c['questions']} questions, {c['captions']} captions")
    print(f"written to {args.out} in {seconds:.1f} s")
    print("\nanswers per family (train):")
    for fam in FAMILIES:
        hist = info["answers"]["train"][fam]
        total = sum(hist.values()) or 1
        print(f"  {fam:16s} " + ", ".join(f"{a} {100 * n / total:.0f}%" for a, n in hist.items()))
    split = "val" if "val" in priors else "train"
    how = "learned on train, applied to val" if split == "val" else "in-sample on train (no val split)"
    print(f"\nquestion-only prior baselines ({how}):")
    print(f"  {'family':16s} | {'questions':>9s} | {'prior acc':>9s} | {'majority acc':>12s}")
    print(f"  {'-' * 16}-+-{'-' * 9}-+-{'-' * 9}-+-{'-' * 12}")
    for fam, v in priors[split].items():
        print(f"  {fam:16s} | {v['questions']:9d} | {100 * v['prior_accuracy']:8.1f}% "
              f"| {100 * v['majority_accuracy']:11.1f}%")
    print("  (prior acc: the most common train answer of the exact question string, else of its family)")
    return 0


def run_info(args: argparse.Namespace) -> int:
    from .images import check_image
    from .readers.shards import ShardSplit, describe
    from .sources import list_splits, open_split

    found = list_splits(args.dir)
    splits = args.split or found
    print(f"{args.dir}: splits {', '.join(found) or 'none'}")
    bad_total = 0
    for split in splits:
        split_data = open_split(args.dir, split, quiet=True)
        if isinstance(split_data, ShardSplit):
            lines = describe(split_data, scan=args.check_images, check_images=args.check_images)
            print("\n".join(lines))
            bad_total += sum(line.startswith("  bad sample") for line in lines)
            continue
        print(split_data.report())
        t = split_data.vqa
        if len(t):
            s = t.strings.items
            ids, counts = np.unique(t.answer_type, return_counts=True)
            types = {s[i] or "?": int(n) for i, n in zip(ids.tolist(), counts.tolist(), strict=True)}
            mc = np.bincount(t.mc)
            top = np.argsort(-mc, kind="stable")[:8]
            print(f"  answer types: {types}")
            print("  top answers: " + ", ".join(f"{s[i]!r} {int(mc[i])}" for i in top.tolist() if mc[i]))
        if args.check_images:
            bad = Counter()
            for path in sorted(split_data.images()):
                reason = check_image(path)
                if reason:
                    bad[reason] += 1
                    print(f"  bad image: {reason}")
            bad_total += sum(bad.values())
            print(f"  images checked: {len(split_data.images())}, unreadable: {sum(bad.values())}")
        if split_data.skipped:
            print(f"  skipped: {skipped_summary(split_data.skipped)}")
    return 1 if bad_total else 0
