"""Training on real pictures: an unreadable or over-large picture is skipped with one warning line and a count
(the run goes on and saves its checkpoint), too many of them stop the run saying so, `vqa data info
--check-images` lists them first, and evaluation during training runs as training does (autocast, loader
workers)."""

from __future__ import annotations

import json
import re

import pytest
import torch
from data_fixtures import write_jsonl
from PIL import Image
from test_train import train_args

from vqa.cli import main
from vqa.config import ModelConfig
from vqa.data import images
from vqa.data.collate import make_collate
from vqa.data.loader import TrainingMicroBatches
from vqa.data.readers.formats import load_split
from vqa.data.stream import Layout
from vqa.data.transforms import build_transform
from vqa.errors import DataError
from vqa.evaluation import evaluate as evaluate_module
from vqa.tokenizer import Tokenizer
from vqa.train import trainer as trainer_module

pytestmark = pytest.mark.slow
SKIPPED = re.compile(r"vqa train: skipped a picture: (.*) \((\d+) unreadable of (\d+) so far\)")


def picture_folder(root, good: int = 10):
    """A JSONL data folder: `good` small pictures, one truncated JPEG and one of 120x100 pixels (over the
    limit the tests set, 10,000)."""
    (root / "pics").mkdir(parents=True)
    rows = []
    for i in range(good):
        Image.new("RGB", (40 + i, 30), (20 * i, 100, 200 - 10 * i)).save(root / "pics" / f"p{i}.png")
        rows.append({"image": f"pics/p{i}.png", "question": "what colour?", "answers": ["blue"],
                     "caption": f"a picture {i}"})
    Image.new("RGB", (60, 40), (1, 2, 3)).save(root / "pics" / "cut.jpg")
    data = (root / "pics" / "cut.jpg").read_bytes()
    (root / "pics" / "cut.jpg").write_bytes(data[: len(data) // 2])
    Image.new("RGB", (120, 100), (9, 9, 9)).save(root / "pics" / "poster.png")
    rows += [{"image": f"pics/{n}", "caption": "a bad picture"} for n in ("cut.jpg", "poster.png")]
    write_jsonl(root / "train.jsonl", rows)
    return root


def test_training_skips_unreadable_pictures_once_each_and_keeps_the_run(tmp_path, capsys, monkeypatch):
    """2 bad pictures of 12 with --max-unreadable 0.25: three epochs train, each bad picture is named once
    with the count so far, and the run ends with its checkpoint."""
    monkeypatch.setattr(images, "MAX_PIXELS", 10_000)
    data = picture_folder(tmp_path / "data")
    out = tmp_path / "run"
    args = train_args(data, out, "--max-steps", "9", "--workers", "0", "--max-unreadable", "0.25",
                      "--image-cache", "off")
    assert main(args) == 0
    err = capsys.readouterr().err
    lines = SKIPPED.findall(err)
    assert sorted(int(n) for _, n, _ in lines) == [1, 2] and {t for *_, t in lines} == {"12"}
    reasons = " ".join(r for r, _, _ in lines)
    assert "cut.jpg: " in reasons
    assert "poster.png is 120x100 = 12,000 pixels, over the limit of 10,000" in reasons
    assert (out / "last").is_dir()


def test_too_many_unreadable_pictures_stop_the_run_saying_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(images, "MAX_PIXELS", 10_000)
    data = picture_folder(tmp_path / "data")
    args = train_args(data, tmp_path / "run", "--max-steps", "3", "--workers", "0", "--max-unreadable", "0.1",
                      "--image-cache", "off")
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "2 of the 12 training pictures are unreadable, more than --max-unreadable 0.1 allows (1)" in err
    assert "Traceback" not in err


def test_loader_workers_share_one_count(tmp_path, capfd):
    """Two loader workers: each bad picture is named once in all, with the count of both workers'."""
    data = picture_folder(tmp_path / "data", good=6)
    Image.new("RGB", (10, 10)).save(data / "pics" / "poster.png")  # readable here: one bad picture of 8
    (data / "pics" / "p3.png").write_text("not a picture")  # a second one
    split = load_split(data, "train")
    tok = Tokenizer.train(["what colour?", "blue", "a picture", "a bad picture"] * 4, vocab_size=60)
    tf = build_transform(ModelConfig(vit_image_size=32, vit_patch_size=8), train=True)
    tb = TrainingMicroBatches(split, tok, tf, 32, ("vqa", "caption"), 1, 1, 0, Layout(workers=2, batch=2),
                      make_collate(tok.pad_id), max_unreadable=0.5)
    for epoch in range(2):
        list(tb.epoch(epoch, 0))
    tb.close()
    lines = SKIPPED.findall(capfd.readouterr().err)
    assert sorted(int(n) for _, n, _ in lines) == [1, 2]
    assert tb.dataset.unreadable.count == 2
    tight = TrainingMicroBatches(split, tok, tf, 32, ("vqa", "caption"), 1, 1, 0, Layout(workers=2, batch=2),
                         make_collate(tok.pad_id), max_unreadable=0.2)
    with pytest.raises(DataError, match="2 of the 8 training pictures are unreadable"):
        list(tight.epoch(0, 0))
    tight.close()


def test_evaluation_during_training_skips_unreadable_pictures(tmp_path, capsys):
    """A val split with one bad picture of 4: the run's evaluations skip it (one line each) and score the
    rest; the run ends with its checkpoints and scores."""
    data = picture_folder(tmp_path / "data", good=6)
    (data / "pics" / "p5.png").write_text("not a picture")  # of train: 3 bad of 8 below the share
    val = [{"image": f"pics/p{i}.png", "question": "what colour?", "answers": ["blue"]} for i in range(3)]
    write_jsonl(data / "val.jsonl", [*val, {"image": "pics/cut.jpg", "question": "what colour?",
                                            "answers": ["blue"]}])
    out = tmp_path / "run"
    args = train_args(data, out, "--max-steps", "2", "--workers", "0", "--max-unreadable", "0.4",
                      "--image-cache", "off")
    assert main(args) == 0
    err = capsys.readouterr().err
    assert re.search(r"skipped a picture in evaluation: .*cut\.jpg: .* \(1 unreadable of 4 so far\)", err), err
    scores = json.loads((out / "best" / "card.json").read_text())["val_scores"]
    assert scores["questions"] == 3


def test_check_images_lists_unreadable_and_over_large_pictures(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(images, "MAX_PIXELS", 10_000)
    data = picture_folder(tmp_path / "data")
    assert main(["data", "info", str(data), "--check-images"]) == 1
    out = capsys.readouterr().out
    bad = [line for line in out.splitlines() if line.startswith("  bad image: ")]
    assert len(bad) == 2 and "cut.jpg: " in bad[0] + bad[1]
    assert any("poster.png is 120x100 = 12,000 pixels, over the limit of 10,000" in b for b in bad)
    assert "images checked: 12, unreadable: 2" in out


def test_evaluation_during_training_runs_under_autocast_with_loader_workers(shapes_dir, tmp_path, monkeypatch):
    """--precision bf16 --workers 1: the evaluation at the end of the run decodes under bf16 autocast, from a
    loader with that many workers (CPU autocast stands in for a GPU's)."""
    seen = {}
    real_eval, real_encode, real_loader = trainer_module.evaluate, evaluate_module.encode_images, \
        evaluate_module.DataLoader

    def spy_eval(*a, **kw):
        seen["kwargs"] = kw
        return real_eval(*a, **kw)

    def spy_encode(model, x, compile):
        seen["autocast"] = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu")
        return real_encode(model, x, compile)

    def spy_loader(*a, **kw):
        seen["num_workers"] = kw.get("num_workers", 0)
        return real_loader(*a, **kw)

    monkeypatch.setattr(trainer_module, "evaluate", spy_eval)
    monkeypatch.setattr(evaluate_module, "encode_images", spy_encode)
    monkeypatch.setattr(evaluate_module, "DataLoader", spy_loader)
    args = train_args(shapes_dir, tmp_path / "run", "--max-steps", "2", "--workers", "1", "--precision", "bf16")
    assert main(args) == 0
    assert seen["kwargs"]["amp_dtype"] == torch.bfloat16 and seen["kwargs"]["workers"] == 1
    assert seen["autocast"] == torch.bfloat16 and seen["num_workers"] == 1
