"""Shards: Shapes converted to webdataset and parquet read back equal to the folder and train; epochs dealt
to ranks and workers see every sample once; resume continues exactly; bad samples are counted and reported,
truncated tars and empty patterns stop clearly."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
from conftest import tiny_set_flags

from vqa.cli import main
from vqa.config import ModelConfig
from vqa.data.collate import make_collate
from vqa.data.convert import convert
from vqa.data.loader import TrainingMicroBatches
from vqa.data.readers.formats import load_split
from vqa.data.readers.shards import ShardSplit
from vqa.data.sources import open_split
from vqa.data.split import corpus_texts
from vqa.data.stream import Layout
from vqa.data.transforms import build_transform
from vqa.errors import DataError
from vqa.tokenizer import Tokenizer

CFG = ModelConfig(vit_image_size=32, vit_patch_size=8)


@pytest.fixture(scope="module")
def shards(shapes_dir, tmp_path_factory):
    """shapes_dir (24 train / 8 val images) as webdataset and as parquet, 5 images a shard."""
    root = tmp_path_factory.mktemp("shards")
    for fmt in ("webdataset", "parquet"):
        for split in ("train", "val"):
            convert(load_split(shapes_dir, split), split, fmt, root / fmt / split, shard_size=5)
    return root


def folder_view(shapes_dir, split):
    """{image bytes: (sorted questions with answers and ids, captions)} of the folder split."""
    sd = load_split(shapes_dir, split)
    out: dict[bytes, tuple] = {}
    for path in sd.images():
        qs = sorted((r.question_id, r.question, tuple(r.answers), r.answer_type, r.question_type,
                     r.multiple_choice_answer) for r in sd.vqa if r.image == path)
        caps = sorted((c.caption_id, c.caption) for c in sd.captions if c.image == path)
        out[path.read_bytes()] = (qs, caps)
    return out


def shard_view(split: ShardSplit):
    out: dict[bytes, tuple] = {}
    for s in split.iter_all():
        assert s.bad is None, s.bad
        qs_, caps_ = s.records()
        qs = sorted((r.question_id, r.question, tuple(r.answers), r.answer_type, r.question_type,
                     r.multiple_choice_answer) for r in qs_)
        out[s.image] = (qs, sorted((c.caption_id, c.caption) for c in caps_))
    return out


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_round_trip_reads_back_the_folders_records(shapes_dir, shards, fmt):
    for split in ("train", "val"):
        src = open_split(shards / fmt, split)
        assert isinstance(src, ShardSplit) and len(src) == len(load_split(shapes_dir, split).images())
        assert len(src.shards) == (5 if split == "train" else 2)
        assert shard_view(src) == folder_view(shapes_dir, split)


def test_parquet_shards_load_with_datasets_as_an_image_column(shards):
    import datasets

    ds = datasets.load_dataset("parquet", data_dir=str(shards / "parquet" / "val"), split="train")
    assert isinstance(ds.features["image"], datasets.Image) and len(ds) == 8
    assert ds[0]["image"].size == (64, 64) and ds[0]["qa"][0]["question"]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_trains_two_steps_on_shards(shards, tmp_path, fmt):
    run = tmp_path / "run"
    assert main(["train", "--data", str(shards / fmt), "--out", str(run), "--max-steps", "2", "--batch-size", "4",
                 "--eval-images", "4", "--log-every", "1", *tiny_set_flags()]) == 0
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if "loss" in r] == [1, 2] and any("val_vqa_accuracy" in r for r in recs)


def batches_for(split, layout, epoch=0, start=0, seed=0, cache="off"):
    src = split
    tok = Tokenizer.train(["what color is it", "a red circle"], vocab_size=60)
    tb = TrainingMicroBatches(src, tok, build_transform(CFG, train=True), 40, ("vqa", "caption"), 6, 1, seed, layout,
                      make_collate(tok.pad_id), image_cache=cache)
    try:
        return [b for b in tb.epoch(epoch, start)], tb
    finally:
        tb.close()


def keys_of(batches):
    """The sample each image of the batches came from (its caption row's meta names shard#key)."""
    out = []
    for b in batches:
        g = next(g for g in b.groups if g.task == "caption")
        out.append([g.meta[g.image_index.tolist().index(k)]["image"] for k in range(b.num_images)])
    return out


def test_workers_share_an_epoch_and_resume_continues_exactly(shards):
    src = open_split(shards / "webdataset", "train")  # 24 samples
    lay = Layout(rank=0, world=1, workers=2, batch=2, accum=1)
    full, tb = batches_for(src, lay, epoch=1)
    assert tb.steps_per_epoch == 12 and len(full) == 12
    seen = [k for b in keys_of(full) for k in b]
    assert len(seen) == len(set(seen)) == 24  # each sample once
    again, _ = batches_for(src, lay, epoch=1)
    assert keys_of(again) == keys_of(full)  # deterministic
    for start in (2, 5, 7):  # steps done before the run was stopped (5: mid-block for both workers)
        rest, _ = batches_for(src, lay, epoch=1, start=start * 2)
        assert keys_of(rest) == keys_of(full)[start:], start
        for a, b in zip(rest, full[start:], strict=True):
            assert torch.equal(a.images, b.images) and torch.equal(a.jitter, b.jitter)
    other, _ = batches_for(src, lay, epoch=2)
    assert keys_of(other) != keys_of(full)  # another epoch, another order


def test_ddp_over_shards_two_gloo_processes_see_every_sample_once(shards, tmp_path):
    """Two ranks x two workers: one epoch, each sample seen by exactly one rank, the same step count."""
    script = tmp_path / "ranks.py"
    script.write_text(f"""
import json, sys
import torch.distributed as dist
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_data_shards import batches_for, keys_of
from vqa import distributed
from vqa.data.sources import open_split
from vqa.data.stream import Layout
d = distributed.setup("cpu")
assert dist.get_backend() == "gloo"
src = open_split({str(shards / 'parquet')!r}, "train")
batches, tb = batches_for(src, Layout(d.rank, d.world, workers=2, batch=3, accum=1))
mine = keys_of(batches)
everyone = [None] * d.world
dist.all_gather_object(everyone, dict(keys=mine, steps=tb.steps_per_epoch))
if d.rank == 0:
    open({str(tmp_path / 'seen.json')!r}, "w").write(json.dumps(everyone))
distributed.cleanup()
""")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
                          str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    ranks = json.loads((tmp_path / "seen.json").read_text())
    assert ranks[0]["steps"] == ranks[1]["steps"] == 4 and all(len(r["keys"]) == 4 for r in ranks)
    seen = [k for r in ranks for b in r["keys"] for k in b]
    assert len(seen) == len(set(seen)) == 24


@pytest.mark.slow
def test_killed_run_on_shards_resumes_exactly(shards, tmp_path):
    from test_train import assert_same_run, run_halted, train_args

    data = shards / "webdataset"
    full, cut = tmp_path / "full", tmp_path / "cut"
    extra = ["--max-steps", "8", "--workers", "2"]
    assert main(train_args(data, full, *extra)) == 0
    run_halted(train_args(data, cut, *extra), 3)
    assert main(train_args(data, cut, *extra, "--resume")) == 0
    assert_same_run(full, cut, 8)


# ---------------------------------------------------------------------------------------------- bad input


def write_tar(path: Path, members: dict[str, bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


def test_bad_samples_are_counted_and_reported_and_training_goes_on(shards, tmp_path, capsys):
    good = next(open_split(shards / "webdataset", "train").iter_all())
    qa = json.dumps(dict(qa=good.qa)).encode()
    write_tar(tmp_path / "d" / "train" / "00000.tar", {
        "a.jpg": good.image, "a.json": qa,                   # fine (the bytes are a PNG named .jpg: still read)
        "b.jpg": b"\xff\xd8not a jpeg", "b.json": qa,        # corrupt image
        "c.jpg": good.image, "c.json": b'{"url": "x"}',      # neither question nor caption
        "d.jpg": good.image, "d.txt": b"a caption",          # fine
    })
    src = open_split(tmp_path / "d", "train")
    assert len(src) == 4
    batches, _ = batches_for(src, Layout(batch=2))
    assert len(batches) == 2 and sum(b.num_images for b in batches) == 4  # every slot kept: equal steps
    rows = sum(g.rows for b in batches for g in b.groups)
    assert rows == min(6, len(good.qa)) + 1  # a's questions (at most 6) and d's caption
    err = capsys.readouterr().err
    assert "00000.tar: sample 'b'" in err and "unreadable image" in err
    assert "00000.tar: sample 'c'" in err and "no question or caption" in err
    assert main(["data", "info", str(tmp_path / "d"), "--check-images"]) == 1  # info lists them too
    out = capsys.readouterr().out
    assert "bad samples: 2" in out and "sample 'b'" in out


def test_truncated_tar_names_the_shard(shards, tmp_path, capsys):
    whole = (shards / "webdataset" / "train" / "00000.tar").read_bytes()
    cut = tmp_path / "d" / "train" / "00000.tar"
    cut.parent.mkdir(parents=True)
    cut.write_bytes(whole[: len(whole) // 2 + 100])
    with pytest.raises(DataError, match=r"00000\.tar: truncated or unreadable tar shard"):
        open_split(tmp_path / "d", "train")  # counting its samples reads it
    (cut.parent / "00000_stats.json").write_text('{"successes": 5}')  # an index: the tar is read only in training
    src = open_split(tmp_path / "d", "train")
    with pytest.raises(DataError, match=r"00000\.tar: truncated or unreadable tar shard"):
        batches_for(src, Layout(batch=1, workers=1))  # from a worker process: the shard, not a traceback
    capsys.readouterr()
    assert main(["train", "--data", str(tmp_path / "d"), "--out", str(tmp_path / "run"), "--batch-size", "1",
                 "--max-steps", "2", *tiny_set_flags()]) == 1
    err = capsys.readouterr().err
    assert "00000.tar: truncated or unreadable tar shard" in err and "Traceback" not in err


def test_empty_pattern_and_missing_shards_are_clear_errors(tmp_path, capsys):
    with pytest.raises(DataError, match=r"no shards"):
        ShardSplit.from_urls("train", "x", [])
    assert main(["train", "--data", str(tmp_path / "none-{0..3}.tar"), "--out", str(tmp_path / "r"),
                 *tiny_set_flags()]) == 1
    assert "none-0.tar does not exist (and 3 more)" in capsys.readouterr().err
    (tmp_path / "empty" / "train").mkdir(parents=True)
    (tmp_path / "empty" / "train" / "00000.parquet").write_bytes(b"")
    with pytest.raises(DataError, match=r"00000\.parquet: not a readable parquet file"):
        open_split(tmp_path / "empty", "train")


def test_tokenizer_text_of_shards_is_the_folders(shapes_dir, shards):
    from vqa.data.sources import training_texts

    folder = sorted(corpus_texts(load_split(shapes_dir, "train")))
    streamed = sorted(t for batch in training_texts(open_split(shards / "webdataset", "train")) for t in batch)
    assert streamed == folder
