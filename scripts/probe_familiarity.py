"""How the demo's familiarity check (vqa.demo.familiarity) behaves for a checkpoint: how many held-out pictures of
the training distribution it flags (false alarms), and its ratio for each sample picture of data/samples.

    python scripts/probe_familiarity.py --checkpoint runs/tiny [--val 1000]

The reference is what the app builds: 256 pictures of the training split named in the checkpoint's card.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", default="runs/tiny")
    p.add_argument("--data", default=None, help="the data folder (default: the one the card names)")
    p.add_argument("--val", type=int, default=1000, help="held-out pictures to check (default 1000)")
    args = p.parse_args()

    from vqa.data.formats import load_split
    from vqa.demo.familiarity import Familiarity
    from vqa.inference.predict import Predictor

    pred = Predictor.from_pretrained(args.checkpoint, device="cpu")
    data = args.data or pred.card["data"]
    ref = Familiarity.from_data(pred, data, pred.card.get("train_split") or "train")
    held_out = sorted(load_split(data, pred.card.get("val_split") or "val", quiet=True).images())[: args.val]
    ratios = np.concatenate([ref.ratio(pred.image_features(held_out[i : i + 64], cache=False))
                             for i in range(0, len(held_out), 64)])
    print(f"reference: {ref.source}; threshold {ref.threshold:.4f} (1.25 x the largest leave-one-out distance)")
    print(f"held-out pictures flagged: {int((ratios > 1).sum())} of {len(ratios)} "
          f"(ratio median {np.median(ratios):.2f}, 99th percentile {np.quantile(ratios, 0.99):.2f}, "
          f"max {ratios.max():.2f})")
    meta = json.loads((ROOT / "data" / "samples" / "samples.json").read_text())
    files = [ROOT / "data" / "samples" / m["file"] for m in meta]
    for m, r in zip(meta, ref.ratio(pred.image_features(files, cache=False)), strict=True):
        print(f"  {m['file']:<16} ({m['kind']}): ratio {r:.2f}{'  -> warned' if r > 1 else ''}")


if __name__ == "__main__":
    main()
