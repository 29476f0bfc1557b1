"""Collections beyond one process: under torchrun each rank captions its contiguous share into a part file and
rank 0 merges them into the 1-process output; `vqa caption --merge` does the merge by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from collect_fixtures import NAMES, photo_folder, png, records, write_tar
from predict_fixtures import shared_checkpoint

from vqa.cli import main


@pytest.mark.slow
def test_two_gloo_processes_merge_into_the_one_process_output(tmp_path):
    ckpt = shared_checkpoint().parent
    photo_folder(tmp_path / "p", 9)
    (tmp_path / "p" / "broken.png").write_bytes(b"\x89PNG not really")
    write_tar(tmp_path / "sh" / "00000.tar", {f"k{k}": png(NAMES[k % 2], (30, 34)) for k in range(4)})
    inputs = [str(tmp_path / "p"), str(tmp_path / "sh" / "00000.tar")]
    one = tmp_path / "one.jsonl"
    assert main(["caption", "--checkpoint", str(ckpt), *inputs, "--out", str(one), "--batch-size", "3"]) == 1
    two = tmp_path / "two.jsonl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "vqa.cli",
           "caption", "--checkpoint", str(ckpt), *inputs, "--out", str(two), "--batch-size", "3", "--device", "cpu"]
    res = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 1, res.stderr[-3000:]  # the broken picture, on both ranks' exit status
    assert "1 of 14 failed" in res.stderr
    a, b = records(one), records(two)
    assert [(r.get("shard"), r["image"], r.get("caption"), "error" in r) for r in b] == \
        [(r.get("shard"), r["image"], r.get("caption"), "error" in r) for r in a]
    for x, y in zip(a, b, strict=True):
        assert set(x) == set(y) and y.get("log_prob", 0) == pytest.approx(x.get("log_prob", 0), abs=1e-4)
    assert sorted(p.name for p in tmp_path.iterdir() if "two" in p.name) == [".two.jsonl.lock", "two.jsonl"]


def test_merge_puts_the_output_first_then_the_parts_by_index(tmp_path, capsys):
    out = tmp_path / "o.jsonl"
    out.write_text(json.dumps(dict(image="a", caption="1")) + "\n")  # what a 1-process run wrote first
    rows = {0: [("c", 2), ("e", 4)], 1: [("b", 1), ("d", 3), ("a", 0)]}  # "a" again: a duplicate, dropped
    for rank, recs in rows.items():
        (tmp_path / f"o.jsonl.part-{rank:05d}").write_text(
            "".join(json.dumps(dict(image=k, caption=str(i), index=i)) + "\n" for k, i in recs))
    (tmp_path / "o.jsonl.part-00001").open("a").write('{"image": "f", "capt')  # cut short by a kill
    assert main(["caption", "--merge", str(out)]) == 0
    assert records(out) == [dict(image=k, caption=c) for k, c in zip("abcde", "11234", strict=True)]
    assert not list(tmp_path.glob("o.jsonl.part-*"))
    assert "merged 5 records" in capsys.readouterr().err
    assert main(["caption", "--merge", str(out)]) == 1  # nothing left to merge
    assert "no part files" in capsys.readouterr().err


FAILS_ON_RANK_1 = """
import os, sys
from vqa.inference.predict import Predictor
run, load = Predictor.caption_batch, Predictor.from_pretrained.__func__
def caption_batch(self, *a, **k):
    if os.environ["RANK"] == "1" and os.environ["FAIL_AT"] == "decode":
        raise RuntimeError("rank 1 broke")
    return run(self, *a, **k)
def from_pretrained(cls, *a, **k):
    if os.environ["RANK"] == "1" and os.environ["FAIL_AT"] == "load":
        raise OSError("rank 1 cannot read its disk")
    return load(cls, *a, **k)
Predictor.caption_batch, Predictor.from_pretrained = caption_batch, classmethod(from_pretrained)
from vqa.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("fail_at, error", [("decode", "RuntimeError: rank 1 broke"),
                                            ("load", "OSError: rank 1 cannot read its disk")])
def test_an_error_on_one_rank_ends_every_rank_saying_which(tmp_path, fail_at, error):
    """Two processes of a process group started without torchrun (whose agent would end the others itself):
    the rank that fails tells the others at their next collective, so none waits for the timeout."""
    import socket

    ckpt = shared_checkpoint().parent
    photo_folder(tmp_path / "p", 6)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(os.environ, OMP_NUM_THREADS="1", RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), FAIL_AT=fail_at)
        procs.append(subprocess.Popen(
            [sys.executable, "-c", FAILS_ON_RANK_1, "caption", "--checkpoint", str(ckpt), str(tmp_path / "p"),
             "--out", str(tmp_path / "o.jsonl"), "--batch-size", "2", "--workers", "0", "--device", "cpu"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    try:
        errs = [p.communicate(timeout=120)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert procs[0].returncode == 1 and procs[1].returncode != 0
    assert error in errs[1]
    assert errs[0].strip().splitlines()[-1] == f"vqa caption: error: rank 1 of 2 failed: {error}", errs[0][-2000:]
    assert "Traceback" not in errs[0]
