"""What tells a collection's items and records apart: an output that is not this tool's is refused and left
unchanged, a rerun with another model or other decoding settings is refused, globs follow the folder rules,
and loader workers read each shard once with the records still in input order."""

from __future__ import annotations

import json
import shutil

import pytest
from collect_fixtures import photo_folder, png, records, write_tar
from predict_fixtures import shared_checkpoint

from vqa.cli import main
from vqa.inference.collection.inputs import expand


@pytest.fixture(scope="module")
def ckpt():
    return shared_checkpoint().parent  # the run folder


# ------------------------------------------------------------------------------ another program's output file


@pytest.mark.parametrize("text", [
    json.dumps([{"image_id": 1, "caption": "a cat"}]),  # what json.dump writes: one line, no newline
    json.dumps({"images": [], "annotations": []}),
    '[{"image_id": 1, "caption": "a c',  # another program's file cut short
    '{"caption": "a cat", "image": "a.png"}',  # an object with an image field, not written by this tool
])
def test_another_programs_file_as_out_is_refused_and_left_unchanged(ckpt, tmp_path, capsys, text):
    photo_folder(tmp_path / "p", 2)
    out = tmp_path / "captions_val.json"
    out.write_text(text)
    assert main(["caption", "--checkpoint", str(ckpt), str(tmp_path / "p"), "--out", str(out),
                 "--workers", "0"]) == 1
    err = capsys.readouterr().err.strip()
    assert "captions_val.json:1: " in err and "choose another --out" in err and len(err.splitlines()) == 1
    assert out.read_text() == text


# ------------------------------------------------------------------------- settings belong to a record's identity


def test_a_rerun_with_other_settings_or_another_model_is_refused(ckpt, tmp_path, capsys):
    photo_folder(tmp_path / "p", 3)
    out = tmp_path / "o.jsonl"
    argv = ["caption", str(tmp_path / "p"), "--out", str(out), "--workers", "0"]
    assert main([*argv, "--checkpoint", str(ckpt)]) == 0
    before = out.read_text()
    stamps = {r["settings"] for r in records(out)}
    assert len(stamps) == 1
    capsys.readouterr()
    assert main([*argv, "--checkpoint", str(ckpt)]) == 0  # the same settings: everything is done already
    assert out.read_text() == before and "3 already in" in capsys.readouterr().err

    assert main([*argv, "--checkpoint", str(ckpt), "--method", "beam", "--num-beams", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "its records were made with other settings" in err and "num_beams=2" in err
    assert len(err.splitlines()) == 1 and out.read_text() == before

    other = tmp_path / "other"  # the same model with other weights
    shutil.copytree(ckpt, other)
    from vqa.weights.checkpoint import resolve

    weights = resolve(other) / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[-8:] = bytes(8)
    weights.write_bytes(bytes(raw))
    assert main([*argv, "--checkpoint", str(other)]) == 2
    assert "other settings" in capsys.readouterr().err and out.read_text() == before
    shutil.copytree(ckpt, tmp_path / "copy")  # a copy of the same checkpoint is the same model
    assert main([*argv, "--checkpoint", str(tmp_path / "copy")]) == 0 and out.read_text() == before


# --------------------------------------------------------------------------------------- globs as folders


def test_a_glob_takes_what_the_folder_form_takes(tmp_path):
    root = tmp_path / "photos"
    files = photo_folder(root, 3)
    (root / "notes.txt").write_text("000.png\nnot/a/picture.png\n")  # a note, not a list of inputs
    write_tar(root / "00000.tar", {"k0": png("red_circle", (30, 30))})
    (root / "00000.parquet").write_bytes(b"img2dataset's metadata of the tar, not a shard of images")
    (root / "00000_stats.json").write_text(json.dumps({"successes": 1}))
    folder = expand([str(root)])
    globbed = expand([str(root / "*")])
    assert [getattr(u, "key", None) or u.url for u in globbed.units] == \
        [getattr(u, "key", None) or u.url for u in folder.units]
    assert len(globbed) == len(folder) == len(files) + 1
    assert sorted(u.key for u in globbed.units if hasattr(u, "key")) == sorted(str(p) for p in files)
    with pytest.raises(Exception, match="matches no images"):
        expand([str(root / "*.txt")])


def test_merge_refuses_parts_made_with_other_settings(tmp_path, capsys):
    out = tmp_path / "o.jsonl"
    for rank, stamp in ((0, "aaaa"), (1, "bbbb")):
        (tmp_path / f"o.jsonl.part-{rank:05d}").write_text(
            json.dumps(dict(image=f"x{rank}", caption="c", settings=stamp, index=rank)) + "\n")
    assert main(["caption", "--merge", str(out)]) == 1
    err = capsys.readouterr().err
    assert "o.jsonl.part-00001: its records were made with other settings (bbbb)" in err and "nothing merged" in err
    assert not out.exists() and len(list(tmp_path.glob("o.jsonl.part-*"))) == 2
