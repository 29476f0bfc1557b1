"""The checkpoints training writes: a round trip predicts identically, an incompatible one is refused, an
interrupted write keeps the previous one, the train state is loaded without pickle code, and saves use their
own temporary folders."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from test_train import train_args

from vqa.cli import main
from vqa.errors import CheckpointError
from vqa.weights import checkpoint

pytestmark = pytest.mark.slow


def test_checkpoint_round_trip_predicts_identically(shapes_dir, tmp_path):
    from vqa.data.readers.formats import load_split
    from vqa.evaluation.evaluate import evaluate

    run = tmp_path / "run"
    assert main(train_args(shapes_dir, run, "--max-steps", "4")) == 0
    model, tok, card = checkpoint.load(run / "last")
    assert card["step"] == 4 and card["preset"] == "tiny"
    val = load_split(shapes_dir, "val")
    first = evaluate(model, tok, val, progress=False)
    checkpoint.save(tmp_path / "copy", model, tok, card)
    again, tok2, _ = checkpoint.load(tmp_path / "copy")
    second = evaluate(again, tok2, val, progress=False)
    assert first["vqa_results"] == second["vqa_results"]
    assert first["caption_results"] == second["caption_results"]
    for k, v in model.state_dict().items():
        assert torch.equal(v, again.state_dict()[k]), k


def test_incompatible_checkpoint_is_refused(shapes_dir, tmp_path):
    run = tmp_path / "run"
    assert main(train_args(shapes_dir, run, "--max-steps", "1")) == 0
    cfg = json.loads((run / "best" / "config.json").read_text())
    cfg["dec_width"] = 64
    (run / "best" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="does not fit"):
        checkpoint.load(run / "best")
    cfg["no_such_field"] = 1
    (run / "best" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="no_such_field"):
        checkpoint.load(run / "best")
    with pytest.raises(CheckpointError, match="does not exist"):
        checkpoint.load(tmp_path / "nowhere")


def test_interrupted_checkpoint_write_keeps_the_previous_one(shapes_dir, tmp_path, monkeypatch):
    run = tmp_path / "run"
    assert main(train_args(shapes_dir, run, "--max-steps", "1")) == 0
    model, tok, card = checkpoint.load(run / "last")
    before = (run / "last" / "model.safetensors").read_bytes()

    def crash(*a, **k):
        raise KeyboardInterrupt  # dies half-way through writing the new checkpoint

    monkeypatch.setattr(checkpoint.torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(run / "last", model, tok, card, train_state={"step": 2})
    assert (run / "last" / "model.safetensors").read_bytes() == before
    checkpoint.load(run / "last")  # still loads
    assert checkpoint.load_train_state(run / "last")["step"] == 1


def test_train_state_is_loaded_without_pickle_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"x": Evil()}, tmp_path / "train_state.pt")
    with pytest.raises(Exception, match="[Ww]eights only"):
        checkpoint.load_train_state(tmp_path)


def test_checkpoint_saves_use_their_own_temporary_folders(shapes_dir, tmp_path):
    run = tmp_path / "run"
    assert main(train_args(shapes_dir, run, "--max-steps", "1")) == 0
    model, tok, card = checkpoint.load(run / "last")
    stale = run / "last.tmp"  # what a save killed mid-write by an older version left behind
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    checkpoint.save(run / "last", model, tok, card)  # not confused by it
    checkpoint.load(run / "last")
    checkpoint.recover(run / "last")  # the trainer's start-up, under the run lock, clears leftovers
    assert not stale.exists()
    # two processes saving one checkpoint folder at once never share a temporary folder
    code = ("import sys; from vqa.weights import checkpoint; m, t, c = checkpoint.load(sys.argv[1]); "
            "[checkpoint.save(sys.argv[2], m, t, c) for _ in range(15)]")
    target = tmp_path / "shared" / "ckpt"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(run / "last"), str(target)],
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs  # each saved its 15 times (an import error fails here)
    assert "SafetensorError" not in "".join(errs) and "Directory not empty" not in "".join(errs), errs
