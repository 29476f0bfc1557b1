"""`vqa data`: build the built-in Shapes set (`vqa data shapes`) or inspect a data folder (`vqa data info`)."""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

from .formats import find_splits, load_split, skipped_summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    p = sub.add_parser("shapes", help="generate the built-in Shapes set (VQA v2 + COCO captions layout)")
    p.add_argument("--out", required=True, type=Path, help="output folder")
    p.add_argument("--train", type=int, default=10000, help="training images (default 10000)")
    p.add_argument("--val", type=int, default=1000, help="validation images (default 1000)")
    p.add_argument("--size", type=int, default=64, help="image side in pixels (default 64)")
    p.add_argument("--seed", type=int, default=0, help="random seed; the same seed gives identical files")
    p.add_argument("--questions-per-family", type=int, default=1,
                   help="questions per image per family (6 families; default 1)")
    p.add_argument("--workers", type=int, default=None, help="rendering processes (default: CPU count, max 8)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    p = sub.add_parser("info", help="list a data folder's splits with their record counts")
    p.add_argument("dir", type=Path, help="data folder")
    p.add_argument("--split", action="append", help="only this split (repeatable)")
    p.add_argument("--check-images", action="store_true", help="also decode every image and report bad ones")


def run(args: argparse.Namespace) -> int:
    return run_shapes(args) if args.data_command == "shapes" else run_info(args)


def run_shapes(args: argparse.Namespace) -> int:
    from .shapes import FAMILIES, generate_shapes

    t0 = time.perf_counter()
    priors = generate_shapes(
        args.out, n_train=args.train, n_val=args.val, size=args.size, seed=args.seed,
        progress=not args.no_progress, workers=args.workers, questions_per_family=args.questions_per_family,
    )
    seconds = time.perf_counter() - t0
    info = json.loads((args.out / "shapes_info.json").read_text())
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
        print(f"  {fam:16s} | {v['questions']:9d} | {100 * v['prior_accuracy']:8.1f}% | {100 * v['majority_accuracy']:11.1f}%")
    print("  (prior acc: the most common train answer of the exact question string, else of its family)")
    return 0


def run_info(args: argparse.Namespace) -> int:
    from .images import check_image

    splits = args.split or find_splits(args.dir)
    print(f"{args.dir}: splits {', '.join(find_splits(args.dir)) or 'none'}")
    bad_total = 0
    for split in splits:
        sd = load_split(args.dir, split, quiet=True)
        print(sd.report())
        if sd.vqa:
            types = Counter(r.answer_type or "?" for r in sd.vqa)
            top = Counter(r.multiple_choice_answer for r in sd.vqa).most_common(8)
            print(f"  answer types: {dict(types)}")
            print("  top answers: " + ", ".join(f"{a!r} {n}" for a, n in top))
        if args.check_images:
            bad = Counter()
            for path in sorted(sd.images()):
                reason = check_image(path)
                if reason:
                    bad[reason] += 1
                    print(f"  bad image: {reason}")
            bad_total += sum(bad.values())
            print(f"  images checked: {len(sd.images())}, unreadable: {sum(bad.values())}")
        if sd.skipped:
            print(f"  skipped: {skipped_summary(sd.skipped)}")
    return 1 if bad_total else 0
