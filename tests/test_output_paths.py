"""An output path that cannot be written is refused before the work, in one line naming the option: a file where
a folder goes (--attention-out, `vqa data shapes --out`, `vqa data convert OUT`, `vqa eval --out`), a folder
where a file goes (`vqa caption --out`), a file in the way of --out's folder; and the demo's --port out of
range. A --out in a folder that does not exist yet is made."""

from __future__ import annotations

import json

import pytest
from cli_fixtures import fails, vqa
from predict_fixtures import COLOR_Q, shared_checkpoint, write_pictures


@pytest.fixture
def img(tmp_path):
    return write_pictures(tmp_path / "pictures")["red_circle"]


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "a-file"
    path.write_text("keep me\n")
    return path


def test_attention_out_that_is_a_file_is_refused_before_answering(img, a_file, capsys):
    fails(capsys, ["ask", "--checkpoint", shared_checkpoint(), "--device", "cpu", img, COLOR_Q,
                   "--attention-out", a_file], rf"--attention-out {a_file} is a file, not a folder")
    fails(capsys, ["ask", "--checkpoint", shared_checkpoint(), "--device", "cpu", img, COLOR_Q,
                   "--attention-out", a_file / "attention"],
          rf"--attention-out {a_file / 'attention'}: {a_file} is a file")
    assert a_file.read_text() == "keep me\n"


def test_caption_out_that_is_a_folder_is_refused_before_the_model_runs(img, tmp_path, capsys):
    folder = tmp_path / "a-folder"
    folder.mkdir()
    for inputs in ([img], [img, img.parent]):
        fails(capsys, ["caption", "--checkpoint", shared_checkpoint(), "--device", "cpu", *inputs, "--out", folder],
              rf"--out {folder} is a folder, not a file")
    assert list(folder.iterdir()) == []


def test_caption_out_under_a_file_is_refused_and_a_new_folder_is_made(img, a_file, tmp_path, capsys):
    fails(capsys, ["caption", "--checkpoint", shared_checkpoint(), "--device", "cpu", img.parent,
                   "--out", a_file / "sub" / "captions.jsonl"],
          rf"--out {a_file / 'sub' / 'captions.jsonl'}: cannot create its folder .*: a file is in the way")
    out = tmp_path / "new" / "deeper" / "captions.jsonl"
    assert vqa(["caption", "--checkpoint", shared_checkpoint(), "--device", "cpu", img.parent, "--out", out]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 2 and all("caption" in r for r in records)


@pytest.mark.parametrize("flags, match", [
    (["--batch-size", "0"], r"--batch-size must be at least 1, got 0"),
    (["--workers", "-1"], r"--workers must be at least 0, got -1"),
])
def test_caption_refuses_a_batch_of_nothing_and_negative_workers(img, capsys, flags, match):
    fails(capsys, ["caption", "--checkpoint", shared_checkpoint(), "--device", "cpu", img, *flags], match)
    fails(capsys, ["caption", "--checkpoint", shared_checkpoint(), "--device", "cpu", img.parent, *flags], match)


def test_data_commands_refuse_an_output_folder_that_is_a_file(a_file, shapes_dir, capsys):
    fails(capsys, ["data", "shapes", "--out", a_file, "--train", "4", "--val", "2", "--no-progress"],
          rf"--out {a_file} is a file, not a folder")
    fails(capsys, ["data", "scenes", "--out", a_file / "under", "--train", "4", "--val", "2", "--no-progress"],
          rf"--out {a_file / 'under'}: {a_file} is a file, not a folder")
    fails(capsys, ["data", "convert", shapes_dir, a_file, "--to", "parquet"], rf"OUT {a_file} is a file, not a folder")
    assert a_file.read_text() == "keep me\n"


def test_eval_refuses_an_out_that_is_a_file_before_scoring(a_file, shapes_dir, capsys):
    fails(capsys, ["eval", "--checkpoint", shared_checkpoint(), "--data", shapes_dir, "--device", "cpu",
                   "--out", a_file], rf"--out {a_file} is a file, not a folder")
    fails(capsys, ["eval", "--checkpoint", shared_checkpoint(), "--data", shapes_dir, "--device", "cpu",
                   "--out", a_file / "scores"], rf"--out {a_file / 'scores'}: {a_file} is a file, not a folder")


@pytest.mark.parametrize("port", ["99999", "0", "-1"])
def test_the_demo_refuses_a_port_out_of_range_before_loading(tmp_path, capsys, port):
    from vqa.demo import server

    with pytest.raises(SystemExit) as e:
        server.main(["--checkpoint", str(tmp_path / "no-such-run"), "--port", port])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"--port must be from 1 to 65535, got {port}" in err and "no checkpoint" not in err
