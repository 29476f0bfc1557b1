"""The collection job's pipeline: positions dealt to ranks and DataLoader workers (each shard to one worker, read
once), records written in input order, images decoded in the worker processes, model calls batched through the
RequestBatcher, the progress bar, and --compile / --int8 reaching the Predictor."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from collect_fixtures import NAMES, photo_folder, png, records, write_tar
from predict_fixtures import shared_checkpoint

import vqa.inference.collection.loader as collection_loader
from vqa.cli import main
from vqa.inference.collection.inputs import expand
from vqa.inference.collection.loader import ChunkSource, chunk_loader, rank_range
from vqa.inference.predict import Predictor


@pytest.fixture(scope="module")
def ckpt():
    return shared_checkpoint().parent  # the run folder


class PidTransform:
    """A stand-in for the model's transform: the "pixels" say which process decoded them."""

    def prepare(self, img, name=None):
        return torch.tensor([os.getpid()])


@pytest.fixture
def mixed(tmp_path):
    """7 image files, then 2 shards of 4 and 3 samples: 14 positions."""
    photo_folder(tmp_path / "p", 7)
    for s, n in ((0, 4), (1, 3)):
        write_tar(tmp_path / "sh" / f"{s:05d}.tar", {f"s{s}k{k}": png(NAMES[k % 2], (30, 30)) for k in range(n)})
    return expand([str(tmp_path / "p"), str(tmp_path / "sh" / "{00000..00001}.tar")])


def emulate(source: ChunkSource, workers: int, monkeypatch) -> list[list]:
    """Each emulated worker's chunks, read in this process as worker w of `workers` would."""
    out = []
    for w in range(workers):
        monkeypatch.setattr(collection_loader, "get_worker_info",
                            lambda w=w: type("I", (), dict(id=w, num_workers=workers)))
        out.append(list(source))
    return out


@pytest.mark.parametrize("world, workers, batch", [(1, 1, 3), (1, 3, 2), (2, 2, 3), (3, 1, 5), (1, 8, 2)])
def test_every_position_is_read_once_by_its_rank_and_worker_and_every_shard_by_one_worker(
        mixed, monkeypatch, world, workers, batch):
    n = len(mixed)
    assert n == 14
    shard_of = {7 + k: 0 for k in range(4)} | {11 + k: 1 for k in range(3)}
    seen = []
    for rank in range(world):
        lo, hi = rank_range(n, rank, world)
        per_worker = emulate(ChunkSource(mixed, lo, hi, batch, PidTransform()), workers, monkeypatch)
        readers: dict[int, set] = {}
        for w, chunks in enumerate(per_worker):
            for c in chunks:  # a chunk: at most `batch` consecutive positions, all of them its items
                assert [it.pos for it in c.items] == list(range(c.start, c.stop)) and 0 < c.stop - c.start <= batch
                for p in range(c.start, c.stop):
                    if p in shard_of:
                        readers.setdefault(shard_of[p], set()).add(w)
        assert all(len(ws) == 1 for ws in readers.values()), readers  # a shard is one worker's
        mine = sorted(p for chunks in per_worker for c in chunks for p in range(c.start, c.stop))
        assert mine == list(range(lo, hi))
        seen += mine
    assert seen == list(range(n))  # contiguous ranges, rank after rank: the input order


def test_eight_workers_read_a_shard_once(tmp_path, monkeypatch):
    import vqa.data.readers.shards as shards

    opened, read = [], []
    groups = shards._tar_groups

    def counting(url):
        opened.append(url)
        for g in groups(url):
            read.append(url)
            yield g

    monkeypatch.setattr(shards, "_tar_groups", counting)
    write_tar(tmp_path / "00000.tar", {f"k{k:03d}": png(NAMES[k % 2], (8, 8)) for k in range(256)})
    write_tar(tmp_path / "00001.tar", {f"j{k:03d}": png(NAMES[k % 2], (8, 8)) for k in range(40)})
    c = expand([str(tmp_path / "{00000..00001}.tar")])
    opened.clear()
    read.clear()
    per_worker = emulate(ChunkSource(c, 0, len(c), 16, PidTransform()), 8, monkeypatch)
    assert sorted(it.pos for chunks in per_worker for ch in chunks for it in ch.items) == list(range(296))
    assert sorted(opened) == [str(tmp_path / "00000.tar"), str(tmp_path / "00001.tar")]
    assert len(read) == 296  # every sample read once


def test_images_are_decoded_in_the_loader_processes_and_done_keys_are_skipped(mixed):
    keys = [(None, u.key, None) for u in mixed.units[:2]]
    source = ChunkSource(mixed, 0, len(mixed), 4, PidTransform(), done=set(keys))
    chunks = list(chunk_loader(source, workers=2))
    items = sorted((it for c in chunks for it in c.items), key=lambda it: it.pos)
    assert [it.pos for it in items] == list(range(2, 14)) and sum(c.skipped for c in chunks) == 2
    pids = {int(it.pixels) for it in items}
    assert len(pids) == 2 and os.getpid() not in pids  # two worker processes, not this one
    assert [it.shard is not None for it in items] == [False] * 5 + [True] * 7
    assert [it.image for it in items[5:]] == [f"s0k{k}" for k in range(4)] + [f"s1k{k}" for k in range(3)]


def test_model_calls_are_batched_through_the_batcher(ckpt, tmp_path, monkeypatch, capsys):
    sizes = []
    run = Predictor.caption_batch

    def spy(self, images, *a, **k):
        sizes.append(len(images))
        assert all(torch.is_tensor(x) and x.dtype == torch.uint8 for x in images)  # decoded by the loader
        return run(self, images, *a, **k)

    monkeypatch.setattr(Predictor, "caption_batch", spy)
    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)  # show the progress bar
    photo_folder(tmp_path / "p", 20)
    out = tmp_path / "o.jsonl"
    assert main(["caption", "--checkpoint", str(ckpt), str(tmp_path / "p"), "--out", str(out),
                 "--batch-size", "8", "--workers", "2"]) == 0
    assert sum(sizes) == 20 and max(sizes) <= 8 and max(sizes) > 1, sizes
    err = capsys.readouterr().err
    assert "vqa caption: 100%" in err and "img/s" in err and "20/20" in err  # tqdm: rate and ETA
    assert len(records(out)) == 20


@pytest.mark.parametrize("flags, want", [([], dict(compile=None, quantize=None)),
                                         (["--compile"], dict(compile=True, quantize=None)),
                                         (["--no-compile", "--int8"], dict(compile=False, quantize="int8"))])
def test_compile_and_int8_reach_the_predictor(ckpt, tmp_path, monkeypatch, flags, want):
    got = {}
    load = Predictor.from_pretrained.__func__

    def spy(cls, path, device=None, **kw):
        got.update(compile=kw.get("compile"), quantize=kw.get("quantize"))
        return load(cls, path, device=device, compile=False)  # the real thing, eager: this test is about the flags

    monkeypatch.setattr(Predictor, "from_pretrained", classmethod(spy))
    photo_folder(tmp_path / "p", 2)
    assert main(["caption", "--checkpoint", str(ckpt), str(tmp_path / "p"), "--out", str(tmp_path / "o.jsonl"),
                 "--workers", "0", *flags]) == 0
    assert got == want
    # one image, as before: never compiled
    got.clear()
    assert main(["caption", "--checkpoint", str(ckpt), str(next(Path(tmp_path / "p").glob("*.png")))]) == 0
    assert got["compile"] is False


def test_a_parquet_shard_is_cut_at_row_groups_each_read_by_one_worker(tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    import vqa.data.readers.shards as shards

    rows = [dict(key=f"r{i:02d}", image=png(NAMES[i % 2], (8, 8)), caption="x") for i in range(40)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "00000.parquet", row_group_size=10)
    read = []
    parquet = shards._read_parquet

    def counting(shard, start, images=True):
        for s in parquet(shard, start, images):
            read.append(s.offset)
            yield s

    monkeypatch.setattr(shards, "_read_parquet", counting)
    c = expand([str(tmp_path / "00000.parquet")])
    source = ChunkSource(c, 0, 40, 8, PidTransform())
    assert source.pieces == [(0, 10), (10, 20), (20, 30), (30, 40)]
    per_worker = emulate(source, 2, monkeypatch)
    assert all(len(chunks) == 4 for chunks in per_worker)  # two workers decode the one shard
    assert sorted(it.pos for chunks in per_worker for ch in chunks for it in ch.items) == list(range(40))
    assert sorted(read) == list(range(40))  # every row read once
