"""Data at real scale: annotation load time and memory, start-up to the first training step, loader images/s
per worker, and peak memory of a short `vqa train` with 0, 2 and 4 loader workers, on a synthetic set with
VQA v2 train2014's exact sizes and file layout.

    python scripts/bench_data.py                          # builds /work/bench-data once (then reuses it)
    python scripts/bench_data.py --scale 0.05 --steps 5   # a quick check at 5% of the size
    python scripts/bench_data.py --only loader            # one part: build, annotations, startup, loader, train

The set (built once under --root, outside the repository): `v2_OpenEnded_mscoco_train2014_questions.json` and
`v2_mscoco_train2014_annotations.json` with 443,757 questions x 10 answers in the official schema (answer
vocabulary, question and answer types, confidences, ids), `annotations/captions_train2014.json` with 414,113
captions, and `train2014/COCO_train2014_<12-digit id>.jpg` for all 82,783 images: hard links to a pool of
--pool real-size 640x480 JPEGs (noise + shapes, ~60-90 KB each), so it takes a few hundred MB of disk. A small
val2014 (--val-images) lets `vqa train` pick both splits without flags.

Each measurement runs in a fresh child process; peak memory is the child's maximum resident set
(`ru_maxrss`), and for training runs with workers also the peak over time of the summed proportional set size
(PSS, /proc/PID/smaps_rollup) of the trainer and its workers, which counts shared pages once. Prints a table and
writes --json. Nothing here is part of the `vqa` package.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# VQA v2 train2014 and COCO captions train2014, as published
FULL = dict(images=82_783, questions=443_757, captions=414_113)
ANSWER_TYPES = ("yes/no", "number", "other")
QUESTION_TYPES = ("what color is the", "how many", "is the", "what is the", "are there", "what is this",
                  "is this a", "what kind of", "where is the", "does the", "what is the man", "which")
NOUNS = ("man", "woman", "dog", "cat", "bus", "car", "table", "plate", "train", "kite", "horse", "child",
         "shirt", "sign", "building", "tree", "bird", "umbrella", "boat", "pizza", "clock", "phone", "bench")
ADJ = ("red", "white", "black", "blue", "green", "large", "small", "wooden", "old", "young", "tall", "empty")


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------ the set


def _answers_vocab(rng: random.Random, n: int = 3000) -> list[str]:
    words = list(NOUNS + ADJ) + ["yes", "no"] + [str(i) for i in range(20)]
    out = ["yes", "no", "2", "1", "white", "3", "red", "blue", "4", "black"]
    while len(out) < n:
        k = rng.choice((1, 1, 2, 2, 3))
        out.append(" ".join(rng.choice(words) for _ in range(k)) + ("" if rng.random() < 0.7 else f" {len(out)}"))
    return out


def _write_json_array(path: Path, head: str, items, tail: str = "}") -> None:
    """{head [item, item, ...] tail}, written as it goes (never the whole file in memory)."""
    import msgspec

    enc = msgspec.json.Encoder()
    with open(path, "wb") as f:
        f.write(head.encode())
        for i, it in enumerate(items):
            if i:
                f.write(b", ")
            f.write(enc.encode(it))
        f.write(("]" + tail).encode())


def _jpeg_pool(folder: Path, n: int) -> list[Path]:
    """n distinct 640x480 JPEGs: noise under a few shapes (what a photo costs to decode, roughly)."""
    from PIL import Image, ImageDraw

    folder.mkdir(parents=True, exist_ok=True)
    out = []
    rng = random.Random(1)
    for k in range(n):
        p = folder / f"pool_{k:04d}.jpg"
        if not p.exists():
            img = Image.effect_noise((640, 480), 30 + k % 40).convert("RGB")
            img = Image.blend(img, Image.new("RGB", img.size, tuple(rng.randrange(256) for _ in range(3))), 0.5)
            d = ImageDraw.Draw(img)
            for _ in range(6):
                x, y = rng.randrange(560), rng.randrange(400)
                d.ellipse((x, y, x + rng.randrange(20, 80), y + rng.randrange(20, 80)),
                          fill=tuple(rng.randrange(256) for _ in range(3)))
            img.save(p, quality=90)
        out.append(p)
    return out


def build_set(root: Path, scale: float, pool: int, val_images: int) -> Path:
    """The synthetic set at `scale` of VQA v2 train2014 (1.0: the exact sizes); reused when already built."""
    n_img = max(1, round(FULL["images"] * scale))
    n_q = max(n_img, round(FULL["questions"] * scale))
    n_c = max(n_img, round(FULL["captions"] * scale))
    out = root / (f"vqa2-scale{scale:g}" if scale != 1 else "vqa2-full")
    stamp = out / "built.json"
    if stamp.exists():
        log(f"reusing {out}")
        return out
    t0 = time.time()
    rng = random.Random(0)
    vocab = _answers_vocab(rng)
    jpegs = _jpeg_pool(root / "jpeg-pool", pool)
    for split, ni, nq, nc in (("train2014", n_img, n_q, n_c), ("val2014", val_images, 5 * val_images,
                                                               5 * val_images)):
        if ni == 0:
            continue
        (out / split).mkdir(parents=True, exist_ok=True)
        ids = sorted(rng.sample(range(1, 600_000), ni))
        for k, i in enumerate(ids):
            link = out / split / f"COCO_{split}_{i:012d}.jpg"
            if not link.exists():
                os.link(jpegs[k % len(jpegs)], link)
        per_image = [nq // ni + (1 if k < nq % ni else 0) for k in range(ni)]

        def questions(ids=ids, per_image=per_image):
            for i, m in zip(ids, per_image, strict=True):
                for j in range(m):
                    q = f"{rng.choice(QUESTION_TYPES)} {rng.choice(ADJ)} {rng.choice(NOUNS)} {rng.choice(NOUNS)}?"
                    yield dict(image_id=i, question=q.capitalize(), question_id=i * 1000 + j)

        def annotations(ids=ids, per_image=per_image):
            rq = random.Random(2)
            for i, m in zip(ids, per_image, strict=True):
                for j in range(m):
                    main = vocab[min(int(rq.paretovariate(1.0)) - 1, len(vocab) - 1)]
                    ans = [main if rq.random() < 0.7 else rq.choice(vocab) for _ in range(10)]
                    yield dict(question_type=rq.choice(QUESTION_TYPES), multiple_choice_answer=main,
                               answers=[dict(answer=a, answer_confidence=rq.choice(("yes", "maybe", "no")),
                                             answer_id=k + 1) for k, a in enumerate(ans)],
                               image_id=i, answer_type=rq.choice(ANSWER_TYPES), question_id=i * 1000 + j)

        info = '{"info": {"description": "synthetic, VQA v2 sizes"}, "license": {"name": "none"}'
        _write_json_array(out / f"v2_OpenEnded_mscoco_{split}_questions.json",
                          info + f', "task_type": "Open-Ended", "data_type": "mscoco", "data_subtype": "{split}", '
                          '"questions": [', questions())
        _write_json_array(out / f"v2_mscoco_{split}_annotations.json",
                          info + f', "data_subtype": "{split}", "annotations": [', annotations())
        (out / "annotations").mkdir(exist_ok=True)
        images = [dict(license=1, file_name=f"COCO_{split}_{i:012d}.jpg", coco_url="", height=480, width=640,
                       date_captured="2013-11-14 16:28:13", flickr_url="", id=i) for i in ids]
        caps_per = [nc // ni + (1 if k < nc % ni else 0) for k in range(ni)]

        def captions(ids=ids, caps_per=caps_per):
            n = 0
            for i, m in zip(ids, caps_per, strict=True):
                for _ in range(m):
                    n += 1
                    yield dict(image_id=i, id=n, caption=f"A {rng.choice(ADJ)} {rng.choice(NOUNS)} next to a "
                                                        f"{rng.choice(ADJ)} {rng.choice(NOUNS)} on the street.")

        import msgspec

        head = ('{"info": {"description": "synthetic"}, "licenses": [], "images": '
                + msgspec.json.encode(images).decode() + ', "annotations": [')
        _write_json_array(out / "annotations" / f"captions_{split}.json", head, captions())
    stamp.write_text(json.dumps(dict(scale=scale, images=n_img, questions=n_q, captions=n_c, pool=pool,
                                     seconds=round(time.time() - t0, 1))) + "\n")
    log(f"built {out} in {time.time() - t0:.0f} s")
    return out


# ------------------------------------------------------------------------------------------ measurements

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
sys.path.insert(0, {root!r})
kind, args = sys.argv[1], sys.argv[2:]
out = {{}}
if kind == "info":
    from vqa.cli import main
    main(["data", "info", *args])
elif kind == "train":
    from vqa.train import trainer as T
    real = T.Trainer.train_step
    def step(self, *a, **k):
        r = real(self, *a, **k)
        out.setdefault("first_step_s", round(time.perf_counter() - t0, 2))
        return r
    T.Trainer.train_step = step
    from vqa.cli import main
    main(["train", *args])
out["seconds"] = round(time.perf_counter() - t0, 2)
out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
print("RESULT " + json.dumps(out))
"""


def _pss_tree(pid: int) -> int:
    """Summed PSS (bytes) of pid and its descendants."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(next(x for x in open(f"/proc/{d}/status") if x.startswith("PPid:")).split()[1])
                kids.setdefault(ppid, []).append(int(d))
            except (OSError, StopIteration):
                pass
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += kids.get(p, [])
        try:
            for line in open(f"/proc/{p}/smaps_rollup"):
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def child(kind: str, args: list[str], env: dict | None = None) -> dict:
    code = CHILD.format(root=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", code, kind, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    peak = [0]

    def watch():
        while proc.poll() is None:
            peak[0] = max(peak[0], _pss_tree(proc.pid))
            time.sleep(0.2)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    stdout, stderr = proc.communicate()
    t.join()
    line = next((x for x in stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        raise SystemExit(f"{kind} {' '.join(args)} failed:\n{stderr[-3000:]}")
    res = json.loads(line[7:])
    res["peak_pss_tree_mb"] = round(peak[0] / 2**20, 1)
    return res


def bench_loader(data: Path, sizes=(64, 224), n: int = 400) -> list[dict]:
    """Images/s of one process (= one loader worker): the transform alone (`model_input`: decode at reduced
    size, letterbox; uint8 augmentation), the same from a full-size decode, and a whole dataset item (also the
    question / caption rows), 640x480 JPEGs."""
    import torch

    from vqa.config import ModelConfig
    from vqa.data.dataset import ImageTextDataset
    from vqa.data.images import load_image
    from vqa.data.readers.formats import load_split
    from vqa.data.transforms import build_transform
    from vqa.tokenizer import Tokenizer

    torch.set_num_threads(1)
    sd = load_split(data, "val2014" if (data / "val2014").is_dir() else "train2014", quiet=True)
    paths = sorted(sd.images())[:n]
    tok = Tokenizer.train(["what color is the bus", "a red bus on the street", "yes", "no"], vocab_size=100)
    rows = []
    for size in sizes:
        cfg = ModelConfig(vit_image_size=size, vit_patch_size=16 if size % 16 == 0 else 8)
        tf = build_transform(cfg, train=True)
        g = torch.Generator().manual_seed(0)
        for p in paths[:20]:  # warm the page cache and the code paths
            tf.augment(tf.prepare(p), generator=g)
        t0 = time.perf_counter()
        for p in paths:
            tf.augment(tf.prepare(p), generator=g)
        transform_ips = len(paths) / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for p in paths:
            tf.augment(tf.prepare(load_image(p)), generator=g)
        full_ips = len(paths) / (time.perf_counter() - t0)
        ds = ImageTextDataset(sd, tok, tf, 48, questions_per_image=6, captions_per_image=1, train=True)
        m = min(len(ds), len(paths))
        t0 = time.perf_counter()
        for i in range(m):
            ds[i]
        item_ips = m / (time.perf_counter() - t0)
        rows.append(dict(size=size, transform_images_per_s=round(transform_ips, 1),
                         without_draft_images_per_s=round(full_ips, 1), item_images_per_s=round(item_ips, 1)))
        log(f"loader {size} px: {rows[-1]}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=Path("/work/bench-data"), help="where the set is built")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of VQA v2 train2014's size (1: exact)")
    ap.add_argument("--pool", type=int, default=400, help="distinct 640x480 JPEGs behind the image links")
    ap.add_argument("--val-images", type=int, default=500, help="val2014 images (5 questions and captions each)")
    ap.add_argument("--steps", type=int, default=20, help="steps of the short training runs")
    ap.add_argument("--preset", default="tiny", help="preset of the training runs (small: 224 px)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", default="0,2,4", help="loader workers of the memory runs")
    ap.add_argument("--image-cache", default="off", help="--image-cache of the training runs")
    ap.add_argument("--only", help="build, annotations, startup, loader or train")
    ap.add_argument("--json", type=Path, help="write the results here")
    a = ap.parse_args()
    data = build_set(a.root, a.scale, a.pool, a.val_images)
    res: dict = dict(data=str(data), scale=a.scale, built=json.loads((data / "built.json").read_text()))

    def want(part: str) -> bool:
        return a.only in (None, part)

    if want("annotations"):
        res["annotations"] = child("info", [str(data), "--split", "train2014"])
        log(f"annotations: {res['annotations']}")
    run_dir = Path(tempfile.mkdtemp(prefix="vqa-bench-data-"))
    common = ["--data", str(data), "--preset", a.preset, "--batch-size", str(a.batch_size), "--eval-every",
              "1000000", "--image-cache", a.image_cache, "--device", "cpu"]
    if want("startup"):
        res["startup"] = child("train", [*common, "--out", str(run_dir / "startup"), "--max-steps", "1",
                                         "--workers", "0"])
        log(f"start-up: {res['startup']}")
    if want("loader"):
        res["loader"] = bench_loader(data)
    if want("train"):
        res["train"] = []
        for w in (int(x) for x in a.workers.split(",")):
            r = child("train", [*common, "--out", str(run_dir / f"w{w}"), "--max-steps", str(a.steps),
                                "--workers", str(w)])
            res["train"].append(dict(workers=w, **r))
            log(f"train, {w} workers: {r}")
    print(json.dumps(res, indent=2))
    if a.json:
        a.json.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
