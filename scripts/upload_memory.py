"""Memory of many large uploads at once: `n` threads ask the demo's handlers (`vqa.demo.handlers.Handlers`, no
gradio server) about one small PNG that decodes to a large picture, while the process's RSS is sampled.

    python scripts/upload_memory.py --checkpoint runs/tiny                     # 32 x 8000x8000, the app's budget
    python scripts/upload_memory.py --checkpoint runs/tiny --budget 0 -n 4     # no budget (4: 32 take ~16 GB)
    python scripts/upload_memory.py --checkpoint runs/tiny --pil-blocks 16     # PIL's default block size (MiB)

Prints the wall time, the RSS growth (its peak while the requests ran, over the RSS before them) and the most
decoded bytes the budget held at once. Linux only (reads /proc/self/statm).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--side", type=int, default=8000, help="the picture's width and height (default 8000)")
    p.add_argument("-n", type=int, default=32, help="requests at once (default 32)")
    p.add_argument("--budget", type=float, default=None, help="decode budget in MiB (default the app's; 0: none)")
    p.add_argument("--pil-blocks", type=int, default=None, help="PIL's block size in MiB (default the app's)")
    args = p.parse_args()

    from PIL import Image

    from vqa.data.images import MAX_PIXELS
    from vqa.demo import uploads
    from vqa.demo.handlers import Handlers
    from vqa.inference.predict import Predictor
    from vqa.inference.serving import SharedPredictor

    uploads.give_back_decoded_memory()
    if args.pil_blocks:
        Image.core.set_block_size(args.pil_blocks << 20)
    pred = Predictor.from_pretrained(args.checkpoint, device="cpu", max_pixels=MAX_PIXELS)
    budget = uploads.DECODING if args.budget is None else uploads.DecodeBudget(
        int(args.budget * 2**20) if args.budget > 0 else 1 << 62, wait=600.0)
    handlers = Handlers(pred, SharedPredictor(pred, attention=True), budget=budget)
    path = Path(tempfile.mkdtemp()) / "large.png"
    Image.new("RGB", (args.side, args.side), (200, 60, 40)).save(path)

    peak, done = [rss()], threading.Event()

    def sample():
        while not done.is_set():
            peak.append(rss())
            done.wait(0.002)

    base, errors = rss(), []
    sampler = threading.Thread(target=sample)
    sampler.start()
    start = time.perf_counter()

    def ask():
        try:
            handlers.ask(str(path), "what color is it?", 1, None)
        except Exception as e:  # a busy message, say: counted, not fatal
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=ask) for _ in range(args.n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    sampler.join()
    print(f"{args.n} x {args.side}x{args.side} ({path.stat().st_size / 1024:.0f} KB file, "
          f"{uploads.decoded_bytes(str(path)) / 2**20:.0f} MiB counted each), budget "
          f"{budget.max_bytes / 2**20:.0f} MiB, PIL blocks {Image.core.get_block_size() >> 20} MiB: "
          f"{time.perf_counter() - start:.1f} s, RSS +{(max(peak) - base) / 2**20:,.0f} MiB, "
          f"held at most {budget.peak / 2**20:,.0f} MiB; {len(errors)} not answered {sorted(set(errors))[:2]}")


if __name__ == "__main__":
    main()
