"""Collection throughput: `vqa caption FOLDER --out FILE` (the batched, pipelined job) against captioning the same
images one `Predictor.caption` call at a time, for the presets on this machine.

    .venv/bin/python scripts/bench_collect.py                          # tiny and small, batch 64
    .venv/bin/python scripts/bench_collect.py --presets small --images 128 --one-by-one 16 --workers 2

Each preset: a randomly initialised model (the presets' shapes; the speed does not depend on the weights) and
a tokenizer trained on a few sentences; --images JPEG photos of 320x240 px written to a temporary folder.
Every caption is exactly 16 tokens (min_new_tokens = max_new_tokens = 16), so both paths do the same work.
  one-by-one    `Predictor.caption(path)` in a loop over the first --one-by-one images (decoding the file,
                the letterbox, the ViT and greedy decoding for each; the Predictor's default compile setting)
  job           `vqa.inference.collection.job.Job` over the folder: DataLoader workers decoding, batches of
                --batch-size through the RequestBatcher, records written to a JSON Lines file; its wall time from the
                first chunk asked for to the last record written (DataLoader start-up included; the model
                load is not, nor is it in the one-by-one figure)
The ratio is job images/s over one-by-one images/s. "x bound" is the job's time over the least time the
machine allows for the same work (`_bench_common.generation_bound` at the job's batch size: the ViT's FLOPs at
the GEMM rate measured at start, the prefill, and each new token's decoder weights and cache bytes at the
measured bandwidth). --variants runs each preset eager and compiled (`Predictor(compile=...)`: the compiled
image encoder and decode step; the job's first, untimed pass compiles its batch shapes). The machine's load
average is printed with the figures: on a busy machine both figures drop, the ratio less so.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import _bench_common as C  # first: it puts the checkout on sys.path
import numpy as np
import torch
from PIL import Image

from vqa.config import GenerationConfig, preset
from vqa.distributed import Dist
from vqa.inference.collection.inputs import expand
from vqa.inference.collection.job import Job, open_output
from vqa.inference.collection.output import Output
from vqa.inference.predict import Predictor
from vqa.model import VQAModel
from vqa.tokenizer import Tokenizer

TOKENS = 16


def photos(folder: Path, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        arr = rng.integers(0, 256, (240, 320, 3), dtype=np.uint8)
        Image.fromarray(arr).save(folder / f"{i:05d}.jpg", quality=90)


def predictor(name: str, device, compile: bool | None = None) -> Predictor:
    texts = ["a photo of a cat on a mat", "a red car in the street", "two people with a dog in a park"] * 20
    tok = Tokenizer.train(texts, vocab_size=200)
    torch.manual_seed(0)
    model = VQAModel(preset(name, **tok.model_ids()))
    return Predictor(model, tok, device=device, compile=compile)


def one_by_one(pred: Predictor, paths: list[Path], settings: GenerationConfig) -> float:
    pred.caption(paths[0], settings)  # warm-up (and the compiling, when the Predictor compiles)
    t0 = time.perf_counter()
    for p in paths:
        pred.caption(p, settings)
    return len(paths) / (time.perf_counter() - t0)


def job(pred: Predictor, folder: Path, settings: GenerationConfig, batch: int, workers: int, out: Path) -> float:
    out.unlink(missing_ok=True)
    output = Output(out)
    open_output(output, Dist())
    s = Job(pred, expand([str(folder)]), output, "caption", settings, batch=batch, workers=workers,
            progress=False).run()
    return s.written / s.seconds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"])
    ap.add_argument("--images", type=int, default=256, help="images the job captions (default 256)")
    ap.add_argument("--one-by-one", type=int, default=32, help="images captioned one call at a time (default 32)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--variants", default="eager,compiled", help="eager, compiled, or both (comma-separated)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = C.pick_device(args.device)
    settings = GenerationConfig.for_task("caption", max_new_tokens=TOKENS, min_new_tokens=TOKENS)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants or set(variants) - {"eager", "compiled"}:
        ap.error("--variants takes eager and/or compiled")
    limits = C.machine_limits(device)
    rows = []
    with tempfile.TemporaryDirectory(prefix="vqa-bench-collect-") as tmp:
        folder = Path(tmp) / "photos"
        photos(folder, args.images)
        paths = sorted(folder.iterdir())[: args.one_by_one]
        for name in args.presets:
            for variant in variants:
                pred = predictor(name, device, compile=variant == "compiled")
                t0 = time.perf_counter()
                job(pred, folder, settings, args.batch_size, args.workers, Path(tmp) / "warm.jsonl")  # compile, caches
                first = time.perf_counter() - t0
                single = one_by_one(pred, paths, settings)
                batched = job(pred, folder, settings, args.batch_size, args.workers, Path(tmp) / "out.jsonl")
                bound = C.generation_bound(pred.model, device, args.batch_size, limits, new_tokens=TOKENS,
                                           prompt_len=len(pred.tokenizer.caption_prompt()))
                bound_rate = args.batch_size / (bound["bound_ms"] / 1e3)
                rows.append([name, f"{pred.model.num_parameters() / 1e6:.1f}M", pred.precision, variant,
                             f"{first:.0f}", f"{single:.1f}", f"{batched:.1f}", f"{batched / single:.2f}x",
                             f"{bound_rate:.0f}", f"{bound_rate / batched:.1f}"])
                print(f"{name} {variant}: first pass {first:.0f} s, one by one {single:.1f} images/s, "
                      f"job {batched:.1f} images/s, bound {bound_rate:.0f} images/s", file=sys.stderr)
    print(f"\n{C.environment(device)}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; "
          f"{args.images} JPEGs of 320x240, {TOKENS} tokens a caption, job batch {args.batch_size}, "
          f"{args.workers} loader workers; {limits['bandwidth'] / 1e9:.1f} GB/s, "
          f"{limits['gemm'] / 1e9:.0f} GFLOP/s\n")
    print(C.table(["preset", "params", "precision", "variant", "first pass s", "one-by-one img/s", "job img/s",
                   "ratio", "bound img/s", "x bound"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
