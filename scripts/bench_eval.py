"""What the paper scores (METEOR, ROUGE-L, the answers' calibration and its reliability plot) add to an
evaluation: `evaluate(paper=False)` (training's scores) against `evaluate(paper=True)` plus the plot (`vqa
eval`'s), alternately in one process, on a checkpoint and a split.

    python scripts/bench_eval.py --checkpoint runs/tiny --data data/shapes --split val [--repeats 2]

Prints the wall seconds of each run and the ratio of the medians. Nothing here is part of the `vqa` package.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--split", default="val")
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()

    from vqa.data.sources import open_split
    from vqa.evaluation.calibration import plot_reliability
    from vqa.evaluation.evaluate import evaluate
    from vqa.weights import checkpoint

    model, tok, card = checkpoint.load(args.checkpoint, "cpu")
    split = open_split(args.data, args.split)
    tasks = tuple(card.get("tasks") or ("vqa", "caption"))
    times: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for paper in (False, True):
                t0 = time.perf_counter()
                s = evaluate(model, tok, split, tasks=tasks, progress=False, paper=paper)["summary"]
                if paper and "calibration" in s:
                    plot_reliability(s["calibration"], Path(tmp) / "reliability.png")
                times[paper].append(time.perf_counter() - t0)
                print(f"paper={paper!s:5}  {times[paper][-1]:6.1f} s  ({s['images']} images)", flush=True)
    base, full = statistics.median(times[False]), statistics.median(times[True])
    print(f"median: without {base:.1f} s, with {full:.1f} s: x{full / base:.2f}")


if __name__ == "__main__":
    main()
