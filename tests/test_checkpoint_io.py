"""Checkpoint folders (vqa/weights/checkpoint.py) without training: a tiny model with random weights and a small
tokenizer, saved and loaded in well under a second, so that mutation testing can run these tests once per
mutant. What each test expects is written out here (the files a folder holds, the order resolve() tries,
the exact error lines), not taken from the module."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import tiny_config

from vqa.errors import CheckpointError
from vqa.model import VQAModel
from vqa.tokenizer import Tokenizer
from vqa.weights import checkpoint

TEXTS = ["what color is the circle?", "a red circle", "a blue square", "what shape is it?", "two green stars"]


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.train(TEXTS * 3, vocab_size=60)


def make_model(tok, seed: int) -> VQAModel:
    """A tiny model whose every tensor is drawn from `seed`, so that no freshly built model has its weights."""
    torch.manual_seed(seed)
    model = VQAModel(tiny_config(**tok.model_ids())).eval()
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return model


@pytest.fixture(scope="module")
def model(tok):
    return make_model(tok, seed=1)


def assert_same_weights(a: VQAModel, b: VQAModel) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def entries(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


class Boom(Exception):
    """What a save that dies half-way raises (a class of its own: no other error can pass for it)."""


def test_round_trip_keeps_every_tensor_the_config_the_tokenizer_and_the_card(tmp_path, model, tok):
    card = {"trained_on": "shapes", "scores": {"vqa_acc": 0.5}, "data": tmp_path / "data"}  # a Path: as a string
    state = {"step": 7, "optimizer": {"state": {0: {"m": torch.arange(4.0)}}}, "rng": torch.tensor([1, 2, 3])}
    folder = tmp_path / "new" / "run" / "last"  # the run folder does not exist yet: made by the save
    assert checkpoint.save(str(folder), model, tok, card, train_state=state) == folder
    assert entries(folder) == {"model.safetensors", "config.json", "tokenizer.json", "card.json",
                               "train_state.pt"}
    # the card is indented JSON with a final newline, for a person reading it
    assert (folder / "card.json").read_text() == (
        '{\n  "trained_on": "shapes",\n  "scores": {\n    "vqa_acc": 0.5\n  },\n'
        f'  "data": "{tmp_path / "data"}"\n}}\n'
    )
    loaded, tok2, card2 = checkpoint.load(str(folder))
    assert not loaded.training
    assert_same_weights(loaded, model)
    assert loaded.cfg == model.cfg
    assert tok2.hf.to_str() == tok.hf.to_str() and tok2.encode("a red circle") == tok.encode("a red circle")
    assert card2 == {"trained_on": "shapes", "scores": {"vqa_acc": 0.5}, "data": str(tmp_path / "data")}
    again = checkpoint.load_train_state(str(folder))
    assert again.keys() == state.keys() and again["step"] == 7
    assert torch.equal(again["optimizer"]["state"][0]["m"], torch.arange(4.0))
    assert torch.equal(again["rng"], torch.tensor([1, 2, 3]))
    # the parent holds the folder and its lock file, nothing else: no temporary folder, no .old
    assert entries(folder.parent) == {"last", ".last.lock"}


def test_a_save_without_card_or_train_state_writes_an_empty_card_and_no_train_state(tmp_path, model, tok):
    folder = checkpoint.save(tmp_path / "ckpt", model, tok)
    assert (folder / "card.json").read_text() == "{}\n"
    assert not (folder / "train_state.pt").exists()
    assert checkpoint.load(folder)[2] == {}
    (folder / "card.json").unlink()  # a folder without a card (written by hand, or an older version)
    assert checkpoint.load(folder)[2] == {}


def test_resolve_tries_the_folder_then_best_best_old_last_last_old(tmp_path):
    order = ["", "best", "best.old", "last", "last.old"]
    run = tmp_path / "run"
    for name in order:
        (run / name).mkdir(parents=True, exist_ok=True)
        (run / name / "model.safetensors").write_bytes(b"")
    (run / "best" / "config.json").write_text("{}")  # a folder without model.safetensors is never picked:
    (run / "other").mkdir()  # neither these nor a subfolder of another name
    (run / "other" / "model.safetensors").write_bytes(b"")
    for i, name in enumerate(order):
        assert checkpoint.resolve(str(run)) == run / name, name
        (run / name / "model.safetensors").unlink()  # gone: the next one in the order is taken
        if i + 1 < len(order):
            assert checkpoint.resolve(run) == run / order[i + 1]
    # a directory named model.safetensors is not a checkpoint
    (run / "last" / "model.safetensors").mkdir()
    with pytest.raises(CheckpointError) as e:
        checkpoint.resolve(run)
    assert str(e.value) == f"no checkpoint in {run}: expected model.safetensors there or in best/ or last/"
    with pytest.raises(CheckpointError) as e:
        checkpoint.resolve(tmp_path / "nowhere")
    assert str(e.value) == f"no checkpoint at {tmp_path / 'nowhere'}: the folder does not exist"


def test_recover_puts_old_back_only_when_the_folder_is_missing_and_clears_temporary_folders(tmp_path):
    run = tmp_path / "run"
    (run / "last.old").mkdir(parents=True)
    (run / "last.old" / "x").write_text("previous")
    for name in ("last.tmp", "last.tmp-123-abcdef01"):  # an older version's name, and today's
        (run / name).mkdir()
        (run / name / "model.safetensors").write_bytes(b"half")
    (run / "best.tmp-1-00000000").mkdir()  # another checkpoint's: not this recover's business
    checkpoint.recover(str(run / "last"))
    assert entries(run) == {"last", "best.tmp-1-00000000"}
    assert (run / "last" / "x").read_text() == "previous"
    # with the folder there, a .old is a leftover of a finished save: neither moved nor put over the folder
    (run / "last.old").mkdir()
    (run / "last.old" / "x").write_text("older")
    (run / "last" / "x").write_text("current")
    checkpoint.recover(run / "last")
    assert (run / "last" / "x").read_text() == "current" and (run / "last.old" / "x").read_text() == "older"
    # a file of such a name cannot be removed as a folder: the trainer's start-up does not stop for it
    (run / "last.tmp-notes").write_text("mine")
    checkpoint.recover(run / "last")
    assert (run / "last" / "x").read_text() == "current"


def test_a_save_that_fails_half_way_keeps_the_previous_checkpoint_and_no_temporary_folder(
        tmp_path, model, tok, monkeypatch):
    folder = checkpoint.save(tmp_path / "last", model, tok, {"v": 1}, train_state={"step": 1})
    before = {name: (folder / name).read_bytes() for name in entries(folder)}
    written = []

    def boom(path):
        written.append(Path(path))
        raise Boom("disk full")

    monkeypatch.setattr(tok, "save", boom)
    with pytest.raises(Boom):  # the save's own error, not one from its clean-up
        checkpoint.save(folder, make_model(tok, seed=2), tok, {"v": 2}, train_state={"step": 2})
    monkeypatch.undo()
    # it was writing into a temporary folder of its own beside the target, of a name recover() clears
    tmp = written[0].parent
    assert re.fullmatch(rf"last\.tmp-{os.getpid()}-[0-9a-f]{{8}}", tmp.name) and tmp.parent == tmp_path
    assert entries(tmp_path) == {"last", ".last.lock"}
    assert {name: (folder / name).read_bytes() for name in entries(folder)} == before
    assert checkpoint.load(folder)[2] == {"v": 1} and checkpoint.load_train_state(folder)["step"] == 1


def test_a_save_over_a_checkpoint_replaces_it_and_leaves_no_old(tmp_path, model, tok):
    folder = checkpoint.save(tmp_path / "last", model, tok, {"v": 1}, train_state={"step": 1})
    (tmp_path / "last.old").mkdir()  # a stale .old beside a good folder (a save died after its renames)
    (tmp_path / "last.old" / "model.safetensors").write_bytes(b"stale")
    newer = make_model(tok, seed=2)
    checkpoint.save(folder, newer, tok, {"v": 2})
    assert entries(tmp_path) == {"last", ".last.lock"}
    assert entries(folder) == {"model.safetensors", "config.json", "tokenizer.json", "card.json"}  # no old file
    loaded, _, card = checkpoint.load(folder)
    assert_same_weights(loaded, newer)
    assert card == {"v": 2}


def test_a_save_killed_between_its_renames_loses_nothing_even_twice(tmp_path, model, tok, monkeypatch):
    run = tmp_path / "run"
    checkpoint.save(run / "last", model, tok, {"v": 1})
    real_rename = Path.rename

    def dies_on_the_second_rename(self, target):
        if ".tmp-" in self.name:
            raise Boom("killed")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", dies_on_the_second_rename)
    with pytest.raises(Boom):
        checkpoint.save(run / "last", make_model(tok, seed=2), tok, {"v": 2})
    # the previous copy was moved aside to last.old, where resolve() finds it
    assert not (run / "last").exists() and checkpoint.resolve(run) == run / "last.old"
    with pytest.raises(Boom):  # a second save dies the same way: the only good copy is not thrown away
        checkpoint.save(run / "last", make_model(tok, seed=3), tok, {"v": 3})
    monkeypatch.undo()
    assert checkpoint.load(run)[2] == {"v": 1}
    checkpoint.recover(run / "last")  # the trainer's start-up: last.old back to last, the dead saves' tmp gone
    assert entries(run) == {"last", ".last.lock"}
    loaded, _, card = checkpoint.load(run / "last")
    assert_same_weights(loaded, model)
    assert card == {"v": 1}


def test_wrapped_models_are_saved_as_the_model_they_wrap(tmp_path, model, tok):
    ddp = SimpleNamespace(module=model)  # what DistributedDataParallel and torch.compile put around it
    compiled = SimpleNamespace(_orig_mod=model)
    both = SimpleNamespace(module=SimpleNamespace(_orig_mod=model))  # DDP of a compiled model (the trainer's)
    for i, wrapped in enumerate((ddp, compiled, both)):
        loaded = checkpoint.load(checkpoint.save(tmp_path / str(i), wrapped, tok))[0]
        assert_same_weights(loaded, model)


def test_the_swap_lock_is_exclusive_while_held_and_released_after(tmp_path):
    folder = tmp_path / "last"
    with checkpoint._swap_lock(folder):
        with open(tmp_path / ".last.lock") as other:  # another open file: another saver
            with pytest.raises(BlockingIOError):  # not even a shared lock while a saver holds it
                fcntl.flock(other.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
    with open(tmp_path / ".last.lock") as other:  # (closing the file would release it too)
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_load_names_the_file_that_is_missing_or_wrong(tmp_path, model, tok):
    good = checkpoint.save(tmp_path / "good", model, tok, {"v": 1})
    for name in ("config.json", "tokenizer.json"):
        folder = tmp_path / f"no-{name}"
        shutil.copytree(good, folder)
        (folder / name).unlink()
        with pytest.raises(CheckpointError) as e:
            checkpoint.load(folder)
        assert str(e.value) == f"checkpoint {folder} is missing {name}"
    # a tokenizer of another vocabulary than the model was built for
    other = Tokenizer.train(TEXTS * 3, vocab_size=45)
    assert other.vocab_size != tok.vocab_size
    folder = tmp_path / "mismatch"
    shutil.copytree(good, folder)
    other.save(folder / "tokenizer.json")
    with pytest.raises(CheckpointError) as e:
        checkpoint.load(folder)
    assert str(e.value) == (f"{folder}: tokenizer has {other.vocab_size} tokens but the model was built for "
                            f"{tok.vocab_size}")
    # a card.json that is not JSON
    folder = tmp_path / "badcard"
    shutil.copytree(good, folder)
    (folder / "card.json").write_text('{"v": 1,\n')
    with pytest.raises(CheckpointError) as e:
        checkpoint.load(folder)
    assert re.fullmatch(rf"{re.escape(str(folder / 'card.json'))}: not valid JSON \(Expecting .*\)", str(e.value))


class Payload:
    """An object of a class of this module: pickle can rebuild it, weights-only loading must not."""

    def __init__(self):
        self.ran = True


def test_load_train_state_refuses_a_missing_file_and_a_pickle_that_is_not_weights_only(tmp_path, monkeypatch):
    with pytest.raises(CheckpointError) as e:
        checkpoint.load_train_state(tmp_path)
    assert str(e.value) == f"cannot resume: {tmp_path / 'train_state.pt'} does not exist"
    torch.save({"step": 1, "payload": Payload()}, tmp_path / "train_state.pt")
    # premise: an ordinary (unsafe) load would rebuild the object
    assert torch.load(tmp_path / "train_state.pt", weights_only=False)["payload"].ran
    with pytest.raises(CheckpointError, match="train_state.pt holds Python objects .*Weights only load failed"):
        checkpoint.load_train_state(tmp_path)
    # ... also where the environment asks torch for unsafe loads by default: weights_only is explicit
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(CheckpointError, match="Weights only load failed"):
        checkpoint.load_train_state(tmp_path)
