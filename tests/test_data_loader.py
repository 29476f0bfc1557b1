"""The training loader: the shared image cache (built once, reused, rebuilt for other images or settings,
within its budget), persistent workers that still draw each epoch's own questions and augmentation, and
worker memory that stays flat."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
from data_fixtures import write_jsonl
from PIL import Image

from vqa.config import ModelConfig
from vqa.data.cache import ImageCache, open_image_cache, parse_budget
from vqa.data.collate import make_collate
from vqa.data.dataset import ImageTextDataset
from vqa.data.loader import TrainingMicroBatches
from vqa.data.preprocess import Preprocess
from vqa.data.readers.formats import load_split
from vqa.data.split import corpus_texts
from vqa.data.stream import Layout
from vqa.data.transforms import build_transform
from vqa.tokenizer import Tokenizer


def loader(sd, workers, size=32, cache="off", budget="25%", batch=4, seed=0):
    tok = Tokenizer.train(corpus_texts(sd), vocab_size=200)
    cfg = ModelConfig(vit_image_size=size, vit_patch_size=8)
    return TrainingMicroBatches(sd, tok, build_transform(cfg, train=True), 48, ("vqa", "caption"), 2, 1, seed,
                        Layout(workers=workers, batch=batch), make_collate(tok.pad_id), image_cache=cache,
                        image_cache_budget=budget, quiet=True)


def by_image(batches):
    """{image: (question ids of its rows, jitter)} over an epoch's batches."""
    out = {}
    for b in batches:
        for k in range(b.num_images):
            rows = [(g.task, m.get("question_id")) for g in b.groups
                    for m, i in zip(g.meta, g.image_index.tolist()[: g.rows], strict=True) if i == k]
            image = next(m["image"] for g in b.groups
                         for m, i in zip(g.meta, g.image_index.tolist()[: g.rows], strict=True) if i == k)
            out[image] = (rows, tuple(round(v, 6) for v in b.jitter[k].tolist()))
    return out


def test_persistent_workers_draw_each_epochs_questions_and_augmentation(shapes_dir):
    sd = load_split(shapes_dir, "train")
    tb = loader(sd, workers=2)
    try:
        e0 = list(tb.epoch(0, 0))
        pids = [w.pid for w in tb.loader._iterator._workers]
        e1 = list(tb.epoch(1, 0))
        assert [w.pid for w in tb.loader._iterator._workers] == pids  # the same worker processes
    finally:
        tb.close()
    a, b = by_image(e0), by_image(e1)
    assert set(a) == set(b) and len(a) == 24
    assert sum(a[k][0] != b[k][0] for k in a) > 12  # other questions (2 of 6) for most images
    assert all(a[k][1] != b[k][1] for k in a)  # other brightness / contrast factors for every image
    plain = loader(sd, workers=0)  # what the workers drew is what one process draws for that epoch
    assert by_image(list(plain.epoch(1, 0))) == b
    for x, y in zip(e1, list(plain.epoch(1, 0)), strict=True):
        assert torch.equal(x.images, y.images)
    plain.close()


def test_image_cache_is_built_once_and_rebuilt_for_other_images_or_settings(shapes_dir, tmp_path, capsys):
    sd = load_split(shapes_dir, "train")
    path = tmp_path / "cache.u8"
    ds = ImageTextDataset(sd, Tokenizer.train(corpus_texts(sd), vocab_size=200),
                          build_transform(ModelConfig(vit_image_size=32, vit_patch_size=8), False), 48, train=False)
    pre = ds.transform.pre
    cache = ImageCache.open(path, ds.images, pre)
    ds.image_cache = cache
    first = [ds[i]["image"] for i in range(len(ds))]
    assert cache.filled() == len(ds)
    again = ImageCache.open(path, ds.images, pre)  # another process, the same images: reused
    assert again.filled() == len(ds) and torch.equal(again.get(3), first[3])
    assert "rebuilding" not in capsys.readouterr().err
    for changed in (dict(size=64), dict(fill=(0, 0, 0)), dict(resize="squash"), dict(resample="bilinear"),
                    dict(std=(0.25, 0.25, 0.25))):  # other settings: a new file
        c = ImageCache.open(path, ds.images, dataclasses.replace(pre, **changed))
        assert c.filled() == 0
    assert "made for other images or settings: rebuilding" in capsys.readouterr().err
    cache = ImageCache.open(path, ds.images, pre)
    ds.image_cache = cache
    [ds[i] for i in range(len(ds))]
    img = Path(ds.images[5])
    Image.new("RGB", (64, 64), (255, 0, 0)).save(img)  # an image changes on disk (size and mtime)
    os.utime(img, ns=(1, 1))
    c = ImageCache.open(path, ds.images, pre)
    assert c.filled() == 0
    ds.image_cache = c
    assert (ds[5]["image"][0] > 200).all()  # the new picture, never the cached old one


def test_auto_cache_only_within_its_budget(shapes_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VQA_CACHE", str(tmp_path / "home"))
    images = [str(p) for p in sorted(load_split(shapes_dir, "train").images())]
    assert open_image_cache("off", "25%", images, Preprocess(32)) is None
    assert open_image_cache("auto", "10K", images, Preprocess(32)) is None  # 24 x 3 KiB + header: over 10 KiB
    assert "image cache off" in capsys.readouterr().err
    c = open_image_cache("auto", "1M", images, Preprocess(32))
    assert c is not None and c.path.parent == tmp_path / "home" / "images"  # in $VQA_CACHE/images
    c.close()
    assert open_image_cache(str(tmp_path / "x.u8"), "1K", images, Preprocess(32)).path == tmp_path / "x.u8"
    assert parse_budget("8G") == 8 * 2**30 and parse_budget("512M") == 512 * 2**20
    assert 0 < parse_budget("25%") < parse_budget("50%")


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads worker RSS from /proc")
def test_worker_memory_stays_flat(tmp_path):
    """2,000 images at 128 px (94 MiB prepared): with the cache over its 32 MiB budget (so off), two
    persistent workers' RSS grows by less than that budget over two epochs. A per-process cache of decoded
    images grew by about half the set per worker per epoch."""
    pics = tmp_path / "pics"
    pics.mkdir()
    src = []
    for k in range(8):
        p = pics / f"src{k}.jpg"
        Image.effect_noise((160, 120), 20 + 5 * k).convert("RGB").save(p, quality=85)
        src.append(p)
    lines = []
    for i in range(2000):
        link = pics / f"{i:05d}.jpg"
        os.link(src[i % 8], link)
        lines.append({"image": f"pics/{link.name}", "caption": f"picture number {i % 8}"})
    write_jsonl(tmp_path / "train.jsonl", lines)
    sd = load_split(tmp_path, "train")
    budget = "32M"
    tb = loader(sd, workers=2, size=128, cache="auto", budget=budget, batch=25)
    assert tb.cache is None  # 2,000 x 48 KiB is over 32 MiB
    try:
        it = tb.epoch(0, 0)
        next(it)
        workers = [w.pid for w in tb.loader._iterator._workers]
        start = [rss(p) for p in workers]
        for _ in it:
            pass
        for _ in tb.epoch(1, 0):
            pass
        grown = [rss(p) - s for p, s in zip(workers, start, strict=True)]
    finally:
        tb.close()
    assert max(grown) < parse_budget(budget), grown
