"""Speed and pixels of a picture's preprocessing (`vqa.data.preprocess.model_input`): JPEG files decoded with
the draft rule every caller uses against the same files decoded at full size first, for letterbox and squash.

    python scripts/bench_preprocess.py                 # 1920x1080 and 640x480 JPEGs, 224 px, 40 files each
    python scripts/bench_preprocess.py --side 384 --n 20

The pictures are made here (noise, shapes, stripes; quality 90) in a temporary folder. For each case it prints
the pictures per second of one process with the draft (what training, serving and collections do) and from a
full-size decode (`load_image` first), and the mean and largest absolute difference of the two inputs in
levels of 255. Nothing here is part of the `vqa` package.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from vqa.data.images import load_image
from vqa.data.preprocess import Preprocess, model_input


def make_pictures(folder: Path, size: tuple[int, int], n: int) -> list[Path]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        w, h = size
        base = rng.integers(0, 60, (h, w, 3), dtype=np.uint8) + np.linspace(0, 150, w, dtype=np.uint8)[None, :, None]
        img = Image.fromarray(base)
        d = ImageDraw.Draw(img)
        for _ in range(12):
            x, y = int(rng.integers(0, w - 40)), int(rng.integers(0, h - 40))
            d.rectangle((x, y, x + w // 10, y + h // 10), fill=tuple(int(c) for c in rng.integers(0, 255, 3)))
        for y in range(0, h // 4, 6):  # a striped banner along the top
            d.rectangle((0, y, w, y + 2), fill=(250, 250, 250))
        p = folder / f"{size[0]}x{size[1]}_{i}.jpg"
        img.save(p, quality=90)
        out.append(p)
    return out


def rate(fn, paths: list[Path]) -> float:
    for p in paths[:5]:
        fn(p)
    t0 = time.perf_counter()
    for p in paths:
        fn(p)
    return len(paths) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--side", type=int, default=224)
    ap.add_argument("--n", type=int, default=40)
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        for size in ((1920, 1080), (640, 480)):
            paths = make_pictures(Path(tmp), size, args.n)
            for resize, resample in (("letterbox", "bicubic"), ("squash", "bilinear")):
                pre = Preprocess.of(args.side, (0.5,) * 3, (0.5,) * 3, resize, resample)
                drafted = rate(lambda p, pre=pre: model_input(p, pre), paths)
                full = rate(lambda p, pre=pre: model_input(load_image(p), pre), paths)
                diffs = [(model_input(p, pre).float() - model_input(load_image(p), pre).float()).abs() for p in paths]
                mean = float(torch.stack([d.mean() for d in diffs]).mean())
                worst = float(max(d.max() for d in diffs))
                print(f"{size[0]}x{size[1]} {resize:9s} {args.side} px: drafted {drafted:6.1f}/s, full decode "
                      f"{full:6.1f}/s ({drafted / full:.1f}x); difference mean {mean:.2f}, max {worst:.0f} of 255")


if __name__ == "__main__":
    main()
