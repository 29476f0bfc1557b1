"""An item's identity in parquet shards without a `key` column (the layout Hugging Face data sets export): keys
include the shard, so evaluation keeps every image and question; an id that repeats stops `vqa eval` and
`vqa train` when the data set is opened, naming both samples, before any decoding or training step."""

from __future__ import annotations

import json

import pytest
from collect_fixtures import NAMES, png
from conftest import tiny_set_flags
from predict_fixtures import COLOR_Q, shared_checkpoint

import vqa.evaluation.evaluate as evaluate_module
from vqa.cli import main
from vqa.data.ids import check_ids
from vqa.data.sources import open_split
from vqa.errors import DataError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def hub_shards(folder, ids: bool = False, n_shards: int = 2, per_shard: int = 2):
    """`per_shard` rows in each of `n_shards` files, no key column; `ids`: image_id and question_id columns
    that restart in every shard, as a per-shard export writes them."""
    folder.mkdir(parents=True, exist_ok=True)
    for s in range(n_shards):
        rows = []
        for k in range(per_shard):
            row = dict(image=dict(bytes=png(NAMES[(s + k) % 2], (30 + s, 30 + k)), path=None), caption="a red circle",
                       question=COLOR_Q, answers=["red"])
            if ids:
                row.update(image_id=k, question_id=k)
            rows.append(row)
        pq.write_table(pa.Table.from_pylist(rows), folder / f"{s:05d}.parquet")
    return folder


@pytest.mark.parametrize("task, results, field", [("caption", "caption_results", "image_id"),
                                                   ("vqa", "vqa_results", "question_id")])
def test_eval_over_two_parquet_shards_without_keys_keeps_every_item(tmp_path, task, results, field):
    hub_shards(tmp_path / "d" / "val")
    out = tmp_path / "eval"
    assert main(["eval", "--checkpoint", str(shared_checkpoint()), "--data", str(tmp_path / "d"), "--split", "val",
                 "--tasks", task, "--out", str(out)]) == 0
    rows = json.loads((out / f"{results}.json").read_text())
    assert len(rows) == 4 and len({r[field] for r in rows}) == 4
    assert json.loads((out / "summary.json").read_text())["images"] == 4


def test_a_repeated_id_stops_eval_before_any_decoding_naming_both_samples(tmp_path, capsys, monkeypatch):
    hub_shards(tmp_path / "d" / "val", ids=True)

    def never(*a, **k):
        raise AssertionError("decoded before the ids were checked")

    monkeypatch.setattr(evaluate_module, "generate", never)
    for task, what in (("caption", "image_id 0"), ("vqa", "question_id 0")):
        assert main(["eval", "--checkpoint", str(shared_checkpoint()), "--data", str(tmp_path / "d"),
                     "--split", "val", "--tasks", task, "--out", str(tmp_path / "eval")]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and what in err, err
        assert "00001.parquet: sample" in err and "00000.parquet: sample" in err
    split = open_split(str(tmp_path / "d"), "val")
    check_ids(split, ("vqa",), max_images=2)  # the first two samples, one shard: no repeat among them
    with pytest.raises(DataError, match="question_id 0"):
        check_ids(split, ("vqa",))


def test_train_stops_at_start_not_at_its_first_evaluation(tmp_path, capsys):
    hub_shards(tmp_path / "d" / "train", n_shards=1, per_shard=4)
    hub_shards(tmp_path / "d" / "val", ids=True)
    run = tmp_path / "run"
    assert main(["train", "--data", str(tmp_path / "d"), "--out", str(run), "--max-steps", "2", "--batch-size", "2",
                 "--eval-every", "1", "--eval-images", "4", *tiny_set_flags()]) == 1
    err = capsys.readouterr().err
    assert "question_id 0 of" in err or "image_id 0 of" in err
    assert "step 1" not in err and not (run / "last").exists()


def test_a_folder_split_with_one_image_id_on_two_pictures_stops_eval_at_start(tmp_path, capsys, monkeypatch):
    d = tmp_path / "d"
    d.mkdir()
    for name, n in (("a.png", 0), ("b.png", 1)):
        (d / name).write_bytes(png(NAMES[n], (30, 30)))
    lines = [dict(image="a.png", caption="a red circle", image_id=1), dict(image="a.png", caption="red", image_id=1),
             dict(image="b.png", caption="a blue square", image_id=1)]
    (d / "val.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))

    def never(*a, **k):
        raise AssertionError("decoded before the ids were checked")

    monkeypatch.setattr(evaluate_module, "generate", never)
    assert main(["eval", "--checkpoint", str(shared_checkpoint()), "--data", str(d), "--split", "val",
                 "--tasks", "caption", "--out", str(tmp_path / "eval")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "image_id 1 is on two image files" in err
    assert str(d / "a.png") in err and str(d / "b.png") in err
