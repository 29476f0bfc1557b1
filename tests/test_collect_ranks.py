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
