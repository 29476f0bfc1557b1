"""Official split names work without flags (train2014 / val2014, train2017 / val2017, OK-VQA), ambiguous
sets are refused with the list and the flag that chooses, and the compact records behave like records."""

from __future__ import annotations

import numpy as np
import pytest
from data_fixtures import write_coco, write_vqa

from vqa.data.readers.formats import load_split, pick_split
from vqa.data.records import VQARecord, VQATable
from vqa.data.sources import list_splits, resolve_splits
from vqa.data.split import SplitData
from vqa.errors import DataError


def test_pick_split_rules():
    assert pick_split(["train", "train2014", "val"], "train", "d", "--train-split") == "train"  # exact name first
    assert pick_split(["train2014", "val2014"], "train", "d", "--train-split") == "train2014"
    assert pick_split(["train2017", "val2017"], "val", "d", "--val-split") == "val2017"
    assert pick_split(["train", "validation"], "val", "d", "--val-split") == "validation"
    assert pick_split(["train2014", "test2015"], "val", "d", "--val-split") is None
    with pytest.raises(DataError, match=r"several splits could be the train split \(train2014, train2017\); "
                                        r"choose one with --train-split "
                                        r"\(the splits found are: test, train2014, train2017\)"):
        pick_split(["test", "train2014", "train2017"], "train", "d", "--train-split")


@pytest.mark.parametrize("year", ["2014", "2017"])
def test_official_names_need_no_flags(tmp_path, year):
    write_vqa(tmp_path, f"train{year}")
    write_vqa(tmp_path, f"val{year}")
    write_coco(tmp_path, f"val{year}", under_annotations=True)
    assert resolve_splits(str(tmp_path), None, None) == (f"train{year}", f"val{year}")
    assert resolve_splits(str(tmp_path), "val" + year, None)[0] == "val" + year  # a given name wins


def test_okvqa_names_and_no_val(tmp_path):
    write_vqa(tmp_path, "train2014", okvqa=True)
    assert resolve_splits(str(tmp_path), None, None) == ("train2014", None)  # trains without evaluation


def test_ambiguous_sets_are_refused_with_the_list(tmp_path):
    write_vqa(tmp_path, "train2014")
    write_vqa(tmp_path, "train2017")
    write_vqa(tmp_path, "val2014")
    with pytest.raises(DataError, match=r"train2014, train2017.*--train-split"):
        resolve_splits(str(tmp_path), None, None)
    assert resolve_splits(str(tmp_path), "train2017", None) == ("train2017", "val2014")
    write_vqa(tmp_path, "val2017")
    with pytest.raises(DataError, match=r"val2014, val2017.*--val-split"):
        resolve_splits(str(tmp_path), "train2017", None)
    (tmp_path / "none").mkdir()
    write_vqa(tmp_path / "none", "test2015")
    with pytest.raises(DataError, match=r"no training split.*test2015.*--train-split"):
        resolve_splits(str(tmp_path / "none"), None, None)


def test_eval_command_picks_val2014(tmp_path, capsys):
    """`vqa eval` without --split scores val2014 when that is the one val split (the model is made up)."""
    import json

    from predict_fixtures import shared_checkpoint

    from vqa.cli import main

    write_vqa(tmp_path / "d", "train2014")
    write_vqa(tmp_path / "d", "val2014")
    ckpt = shared_checkpoint()
    out = tmp_path / "eval"
    assert main(["eval", "--checkpoint", str(ckpt), "--data", str(tmp_path / "d"), "--out", str(out),
                 "--tasks", "vqa"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["split"] == "val2014" and summary["questions"] == 6


def test_shard_folders_are_splits(tmp_path):
    for split in ("train", "val"):
        (tmp_path / split).mkdir()
        (tmp_path / split / "00000.tar").write_bytes(b"")
    (tmp_path / "images").mkdir()  # a folder of pictures is no split
    assert list_splits(tmp_path) == ["train", "val"]
    assert list_splits(str(tmp_path / "train" / "{00000..00003}.tar")) == ["train"]


def test_tables_give_records_and_keep_every_answer(tmp_path):
    write_vqa(tmp_path, "train2014")
    sd = load_split(tmp_path, "train2014")
    t = sd.vqa
    assert isinstance(t, VQATable) and t.answers.dtype == np.int32 and isinstance(t.question_id, np.ndarray)
    recs = list(t)
    assert [r.question_id for r in recs] == t.question_id.tolist() and len(t[0].answers) == 10
    again = SplitData("x", tmp_path, vqa=recs)  # records in, the same records out
    assert list(again.vqa) == recs
    sub = t.select(np.array([3, 0]))
    assert [r.question_id for r in sub] == [recs[3].question_id, recs[0].question_id]
    assert sub[0].answers == recs[3].answers
    mixed = VQATable.from_records([VQARecord(tmp_path / "a.png", "q?", ["", "b"], "train:1", 5)])
    assert mixed[0].question_id == "train:1" and mixed[0].answers == ["", "b"] and mixed.question_id == ["train:1"]
