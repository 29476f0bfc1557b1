"""`vqa caption` / `vqa ask` over collections: INPUTs expanded in order (folders, globs, lists, shards), one
JSON record per input equal to the Predictor's one-by-one answer, bad inputs recorded and counted, the exit
status, and the usage errors that stop before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from collect_fixtures import NAMES, kind, photo_folder, png, records, write_tar
from predict_fixtures import COLOR_Q, SHAPE_Q, shared_checkpoint

from vqa.cli import main
from vqa.inference.collection.inputs import expand
from vqa.inference.predict import Predictor


@pytest.fixture(scope="module")
def ckpt():
    return shared_checkpoint().parent  # the run folder


@pytest.fixture(scope="module")
def pred(ckpt):
    return Predictor.from_pretrained(ckpt, device="cpu", compile=False)


# ------------------------------------------------------------------------------------------------ expansion


def test_inputs_expand_in_order_folders_recursively_globs_lists_and_shards(tmp_path):
    files = photo_folder(tmp_path / "photos", 6)
    (tmp_path / "photos" / "notes.json").write_text("{}")  # not an image by extension: not an input
    (tmp_path / "photos" / ".hidden.png").write_bytes(b"x")
    lst = tmp_path / "lists" / "some.txt"
    lst.parent.mkdir()
    lst.write_text("# two of them\n../photos/001.png\n\n../photos/002.png\n")
    write_tar(tmp_path / "shards" / "00000.tar",
              {"k0": png("red_circle", (30, 30)), "k1": png("blue_square", (30, 30))})
    write_tar(tmp_path / "shards" / "00001.tar", {"k2": png("red_circle", (30, 30))})
    c = expand([str(tmp_path / "photos"), str(lst), str(tmp_path / "photos" / "00*.png"),
                str(tmp_path / "shards" / "{00000..00001}.tar")])
    keys = [u.key for u in c.units if hasattr(u, "key")]
    # the list's paths and the glob's are the folder's files again: one position each, the first
    assert keys == [str(p) for p in files] and len(c) == 6 + 3
    assert [u.n for u in c.units[6:]] == [2, 1] and c.describe() == "6 image files and 3 samples in 2 shards"
    listed = expand([str(lst)])
    assert [u.key for u in listed.units] == [str(lst.parent / "../photos/001.png"),
                                             str(lst.parent / "../photos/002.png")]


# ------------------------------------------------------------------------------------------------- captions


def test_a_folder_is_captioned_as_one_by_one_calls_with_bad_files_recorded(ckpt, pred, tmp_path, capsys, monkeypatch):
    import vqa.data.images

    files = photo_folder(tmp_path / "photos")
    bad = {
        "notes.jpg": (b"not an image at all", "not an image file"),
        "cut.png": (png("red_circle", (40, 40))[:60], "truncated"),
        "huge.png": (png("blue_square", (64, 64)), "over the limit"),
    }
    for name, (data, _) in bad.items():
        (tmp_path / "photos" / name).write_bytes(data)
    monkeypatch.setattr(vqa.data.images, "MAX_PIXELS", 60 * 60)  # the 64 px one is "huge"; forked workers see it
    out = tmp_path / "captions.jsonl"
    code = main(["caption", "--checkpoint", str(ckpt), str(tmp_path / "photos"), "--out", str(out),
                 "--batch-size", "4", "--workers", "2"])
    assert code == 1  # some failed
    err = capsys.readouterr().err
    assert "3 of 15 failed" in err
    recs = records(out)
    by_image = {r["image"]: r for r in recs}
    assert len(by_image) == len(recs) == 15
    for name, (_, why) in bad.items():
        r = by_image[str(tmp_path / "photos" / name)]
        assert set(r) == {"image", "error", "settings"} and why in r["error"] and name in r["error"]
    for p in files:
        want = pred.caption(p)
        r = by_image[str(p)]
        assert r["caption"] == want.caption and r["log_prob"] == pytest.approx(want.log_prob, abs=1e-4)
    # input order: the walk's order, sorted names within a folder, the folder's files before its sub-folders'
    walk = sorted([p.name for p in files[:8]] + list(bad)) + [p.name for p in files[8:]]
    assert [Path(r["image"]).name for r in recs] == walk


def test_every_answered_is_exit_0_and_one_image_without_out_prints_as_before(ckpt, tmp_path, capsys):
    files = photo_folder(tmp_path / "p", 4)
    assert main(["caption", "--checkpoint", str(ckpt), str(tmp_path / "p"), "--out", str(tmp_path / "o.jsonl"),
                 "--workers", "0"]) == 0
    assert "all 4 answered" in capsys.readouterr().err
    assert main(["caption", "--checkpoint", str(ckpt), str(files[0])]) == 0
    assert capsys.readouterr().out == "a {} {}\n".format(*kind(files[0]))
    assert main(["caption", "--checkpoint", str(ckpt), str(files[0]), str(files[1])]) == 0  # many: JSONL on stdout
    assert [r["caption"] for r in map(json.loads, capsys.readouterr().out.splitlines())] == [
        "a {} {}".format(*kind(f)) for f in files[:2]]


def test_shards_are_read_as_training_reads_them_keys_and_shards_in_the_records(ckpt, pred, tmp_path):
    samples = {f"{s:05d}{k:04d}": png(NAMES[(s + k) % 2], (30 + k, 36)) for s in range(2) for k in range(3)}
    keys = list(samples)
    for s in range(2):
        write_tar(tmp_path / "sh" / f"{s:05d}.tar", {k: samples[k] for k in keys[3 * s : 3 * s + 3]})
    write_tar(tmp_path / "bad" / "00000.tar", {"x": b"garbage bytes", "y": samples[keys[0]]}, ext="jpg")
    out = tmp_path / "c.jsonl"
    code = main(["caption", "--checkpoint", str(ckpt), str(tmp_path / "sh" / "{00000..00001}.tar"),
                 str(tmp_path / "bad" / "00000.tar"), "--out", str(out), "--batch-size", "2"])
    assert code == 1
    recs = records(out)
    assert [(r["shard"], r["image"]) for r in recs] == \
        [(str(tmp_path / "sh" / f"{int(k[:5]):05d}.tar"), k) for k in keys] + \
        [(str(tmp_path / "bad" / "00000.tar"), "x"), (str(tmp_path / "bad" / "00000.tar"), "y")]
    for r in recs[:6]:
        assert r["caption"] == pred.caption(samples[r["image"]]).caption
    assert "x" in recs[6]["error"] and "not an image" in recs[6]["error"] and recs[7]["caption"] == "a red circle"


def test_parquet_shards(ckpt, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [dict(key=f"r{i}", image=png(NAMES[i % 2], (33, 30)), caption="x") for i in range(3)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "00000.parquet")
    out = tmp_path / "c.jsonl"
    assert main(["caption", "--checkpoint", str(ckpt), str(tmp_path / "00000.parquet"), "--out", str(out)]) == 0
    assert [(r["image"], r["caption"]) for r in records(out)] == [
        ("r0", "a red circle"), ("r1", "a blue square"), ("r2", "a red circle")]


# -------------------------------------------------------------------------------------------------- answers


def test_ask_a_questions_file_and_one_question_for_every_image(ckpt, pred, tmp_path):
    files = photo_folder(tmp_path / "p", 4)
    qs = tmp_path / "q.jsonl"
    lines = [dict(image=f"p/{files[0].name}", question=COLOR_Q, question_id=7),
             dict(image=f"p/{files[1].name}", question=SHAPE_Q),
             dict(image="p/missing.png", question=SHAPE_Q)]
    qs.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "a.jsonl"
    assert main(["ask", "--checkpoint", str(ckpt), "--questions", str(qs), "--out", str(out), "--top-k", "2"]) == 1
    recs = records(out)
    assert [r["image"] for r in recs] == [x["image"] for x in lines]
    for r, f in zip(recs[:2], files, strict=False):
        want = pred.answer(f, r["question"], top_k=2)
        assert r["answer"] == want.answer and r["probability"] == pytest.approx(want.top_k[0][1], abs=1e-4)
        assert [a["answer"] for a in r["top_k"]] == [a for a, _ in want.top_k]
    assert recs[0]["question_id"] == 7 and recs[0]["answer"] == kind(files[0])[0]
    assert recs[1]["answer"] == kind(files[1])[1] and "question_id" not in recs[1]
    assert "image file not found" in recs[2]["error"] and recs[2]["question"] == SHAPE_Q
    out2 = tmp_path / "b.jsonl"
    assert main(["ask", "--checkpoint", str(ckpt), str(tmp_path / "p"), SHAPE_Q, "--out", str(out2)]) == 0
    assert [(r["image"], r["answer"]) for r in records(out2)] == [(str(f), kind(f)[1]) for f in files]


# ------------------------------------------------------------------------------------ errors before any work


@pytest.mark.parametrize("case, message", [
    ("empty folder", "the folder holds no images"),
    ("missing shard", "does not exist"),
    ("no match", "the pattern matches no files"),
    ("missing input", "no such file, folder or shard"),
    ("malformed line", "q.jsonl:2:2: malformed JSON"),
    ("no question", "q.jsonl:1: field 'question' must be a non-empty string"),
    ("bad id", "q.jsonl:2: field 'question_id' must be a string or an integer"),
])
def test_input_errors_stop_before_any_work_with_one_line(ckpt, tmp_path, capsys, case, message):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    write_tar(tmp_path / "00000.tar", {"a": png("red_circle", (30, 30))})
    qs = tmp_path / "q.jsonl"
    qs.write_text('{"image": "a.png", "question": "' + ("what?" if case != "no question" else "") + '"}\n'
                  + ("{oops\n" if case == "malformed line" else "")
                  + ('{"image": "a.png", "question": "why?", "question_id": [1]}\n' if case == "bad id" else ""))
    out = tmp_path / "out.jsonl"
    inputs = {"empty folder": [str(tmp_path / "empty")], "missing shard": [str(tmp_path / "{00000..00001}.tar")],
              "no match": [str(tmp_path / "*.jpg")], "missing input": [str(tmp_path / "nope"), str(tmp_path / "x")]}
    if case in inputs:
        argv = ["caption", "--checkpoint", str(ckpt), *inputs[case], "--out", str(out)]
    else:
        argv = ["ask", "--checkpoint", str(ckpt), "--questions", str(qs), "--out", str(out)]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


# --------------------------------------------------------------------------------------------------- resuming

SLOW = """
import sys, time
from vqa.inference.predict import Predictor
run = Predictor.caption_batch
def slow(self, *a, **k):
    time.sleep(0.1)
    return run(self, *a, **k)
Predictor.caption_batch = slow
from vqa.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_rerun_appends_what_is_missing_after_a_cut_short_run(ckpt, tmp_path, capsys):
    photo_folder(tmp_path / "photos", 10)
    (tmp_path / "photos" / "bad.png").write_bytes(b"\x89PNG broken")
    argv = ["caption", "--checkpoint", str(ckpt), str(tmp_path / "photos"), "--batch-size", "3", "--workers", "0"]
    whole = tmp_path / "whole.jsonl"
    assert main([*argv, "--out", str(whole)]) == 1
    lines = whole.read_text().splitlines(keepends=True)
    out = tmp_path / "cut.jsonl"
    out.write_text("".join(lines[:4]) + lines[4][:20])  # four records and a fifth cut short, as a kill leaves it
    assert main([*argv, "--out", str(out)]) == 1
    assert "cut.jsonl:5: removed a record cut short" in capsys.readouterr().err
    same_records(records(out), records(whole))


@pytest.mark.slow
def test_a_run_killed_mid_way_and_rerun_equals_an_uninterrupted_run(ckpt, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    photo_folder(tmp_path / "photos", 40)
    (tmp_path / "photos" / "bad.png").write_bytes(b"\x89PNG broken")
    argv = ["caption", "--checkpoint", str(ckpt), str(tmp_path / "photos"), "--batch-size", "2", "--workers", "1"]
    out = tmp_path / "resumed.jsonl"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", SLOW, *argv, "--out", str(out)], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while (not out.exists() or out.read_text().count("\n") < 6) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the job and its loader worker
        proc.wait()
    done = out.read_text().count("\n")
    assert 6 <= done < 41, done  # killed mid-way
    with open(out, "a") as f:
        f.write('{"image": "' + str(tmp_path / "photos" / "0"))  # a record cut short by the kill
    assert main([*argv, "--out", str(out)]) == 1  # the broken picture: exit 1
    whole = tmp_path / "whole.jsonl"
    assert main([*argv, "--out", str(whole)]) == 1
    same_records(records(out), records(whole))  # same keys, same order, same captions and scores
    assert len(records(whole)) == 41 and sum("error" in r for r in records(whole)) == 1
    before = out.read_text()
    assert main([*argv, "--out", str(out)]) == 1  # nothing left to do: the file stays as it is
    assert out.read_text() == before


def same_records(a: list[dict], b: list[dict]) -> None:
    """Equal records; scores to 1e-5 (a batch of other images may change a float's last bits)."""
    assert [(r["image"], r.get("caption"), r.get("error")) for r in a] == \
        [(r["image"], r.get("caption"), r.get("error")) for r in b]
    for x, y in zip(a, b, strict=True):
        assert set(x) == set(y) and x.get("log_prob", 0) == pytest.approx(y.get("log_prob", 0), abs=1e-5)


def test_a_second_writer_of_one_output_is_refused(ckpt, tmp_path, capsys):
    import os

    from vqa.locks import RunLock

    photo_folder(tmp_path / "p", 2)
    out = tmp_path / "o.jsonl"
    argv = ["caption", "--checkpoint", str(ckpt), str(tmp_path / "p"), "--out", str(out), "--workers", "0"]
    with RunLock.for_file(out):  # another process holds it the same way (flock is per open file)
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"o.jsonl is being written by process {os.getpid()}" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
    assert main(argv) == 0 and len(records(out)) == 2  # free again


def test_a_malformed_line_inside_the_output_stops_before_any_work(ckpt, tmp_path, capsys):
    photo_folder(tmp_path / "p", 2)
    out = tmp_path / "o.jsonl"
    out.write_text('{"image": "a", "caption": "x"}\nnot json\n{"image": "b", "caption": "y"}\n')
    assert main(["caption", "--checkpoint", str(ckpt), str(tmp_path / "p"), "--out", str(out)]) == 1
    assert "o.jsonl:2: malformed JSON in the output file" in capsys.readouterr().err
    assert out.read_text().count("\n") == 3


def test_an_img2dataset_folder_with_a_truncated_tar_records_the_samples_it_lost(ckpt, tmp_path):
    tar = write_tar(tmp_path / "00000.tar", {f"k{k}": png(NAMES[k % 2], (30, 34)) for k in range(4)})
    tar.write_bytes(tar.read_bytes()[: tar.stat().st_size * 2 // 3])  # cut inside the last sample
    (tmp_path / "00000_stats.json").write_text(json.dumps({"successes": 4}))  # img2dataset's count: read first
    (tmp_path / "00000.parquet").write_bytes(b"img2dataset's metadata of the tar, not a shard of images")
    out = tmp_path / "o.jsonl"
    assert main(["caption", "--checkpoint", str(ckpt), str(tmp_path), "--out", str(out), "--workers", "0"]) == 1
    recs = records(out)
    assert [r["image"] for r in recs] == ["k0", "k1", "k2", "#3"] and {r["shard"] for r in recs} == {str(tar)}
    assert [r.get("caption") for r in recs[:3]] == ["a red circle", "a blue square", "a red circle"]
    assert "truncated or unreadable tar shard" in recs[3]["error"] and str(tar) in recs[3]["error"]
