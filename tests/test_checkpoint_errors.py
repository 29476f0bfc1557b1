"""A damaged checkpoint file is named in one line (CheckpointError), by the library and by every command that
reads it: a model.safetensors cut short, a card.json that is not an object, a train_state.pt cut short or
holding code to run."""

from __future__ import annotations

import json
import os
import pickle
import shutil

import pytest
import torch
from cli_fixtures import fails, vqa
from conftest import tiny_set_flags
from predict_fixtures import shared_checkpoint, write_pictures

from vqa.errors import CheckpointError
from vqa.weights import checkpoint


@pytest.fixture
def copy(tmp_path):
    """A copy of the shared trained checkpoint, to damage."""
    return shutil.copytree(shared_checkpoint(), tmp_path / "ckpt")


def cut(path, keep: int | None = None) -> None:
    """Cut the file `path` short: its first `keep` bytes (default: half)."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 if keep is None else keep])


@pytest.mark.parametrize("keep", [None, 4, -10])
def test_a_model_file_cut_short_is_named(copy, keep):
    weights = copy / "model.safetensors"
    cut(weights, None if keep is None else keep if keep > 0 else weights.stat().st_size + keep)
    with pytest.raises(CheckpointError, match=rf"{weights} is not a complete safetensors file: "):
        checkpoint.load(copy)


def test_caption_and_export_name_a_model_file_cut_short(copy, tmp_path, capsys):
    cut(copy / "model.safetensors")
    img = write_pictures(tmp_path)["red_circle"]
    match = r"model.safetensors is not a complete safetensors file"
    fails(capsys, ["caption", "--checkpoint", copy, "--device", "cpu", img], match, status=1)
    fails(capsys, ["ask", "--checkpoint", copy, "--device", "cpu", img, "what color is the shape?"], match, status=1)
    pytest.importorskip("onnxscript")  # the `onnx` extra
    fails(capsys, ["export", "--checkpoint", copy, "--onnx", tmp_path / "onnx"], match, status=1)


@pytest.mark.parametrize("card", [[1, 2], "a string", 3])
def test_a_card_that_is_not_an_object_is_named(copy, tmp_path, capsys, card):
    (copy / "card.json").write_text(json.dumps(card))
    with pytest.raises(CheckpointError, match=rf"{copy / 'card.json'}: expected a JSON object \(the model card\), "
                                              rf"got {type(card).__name__}"):
        checkpoint.load(copy)
    fails(capsys, ["caption", "--checkpoint", copy, "--device", "cpu", write_pictures(tmp_path)["red_circle"]],
          r"card.json: expected a JSON object", status=1)


def test_a_train_state_cut_short_is_named(tmp_path):
    f = tmp_path / "train_state.pt"
    torch.save({"step": 3, "weights": torch.zeros(1000)}, f)
    for keep in (None, 10, 0):
        cut(f, keep)
        try:  # the first sentence of torch's own error is what the line names
            torch.load(f, weights_only=True)
        except (RuntimeError, EOFError, OSError) as e:
            said = str(e).split(". ")[0] or type(e).__name__  # an empty file: EOFError, no message
        with pytest.raises(CheckpointError) as e:
            checkpoint.load_train_state(tmp_path)
        assert str(e.value) == (f"cannot resume: {f} is not a complete train state ({said}); train again without "
                                "--resume, or start a new run with --init-from to keep the weights")
    torch.save([1, 2], tmp_path / "train_state.pt")
    with pytest.raises(CheckpointError, match=r"train_state.pt holds a list, not a train state"):
        checkpoint.load_train_state(tmp_path)


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


@pytest.mark.parametrize("error, said", [
    (EOFError(), "EOFError"),  # no message: the error's name
    (RuntimeError("PytorchStreamReader failed reading file data/0: invalid header. A second sentence"),
     "PytorchStreamReader failed reading file data/0: invalid header"),
])
def test_a_damaged_train_state_is_named_by_torchs_first_sentence(tmp_path, monkeypatch, error, said):
    f = tmp_path / "train_state.pt"
    f.write_bytes(b"PK")

    def load(*args, **kwargs):
        raise error

    monkeypatch.setattr(torch, "load", load)
    with pytest.raises(CheckpointError) as e:
        checkpoint.load_train_state(tmp_path)
    assert str(e.value) == (f"cannot resume: {f} is not a complete train state ({said}); train again without "
                            "--resume, or start a new run with --init-from to keep the weights")


def test_a_train_state_that_is_no_pickle_of_torchs_is_named_not_called_code(tmp_path, monkeypatch):
    """Bytes that are no torch file fail weights_only's unpickler without a class in sight: the line says the file
    cannot be read, with the unpickler's reason, and does not claim it holds code."""
    f = tmp_path / "train_state.pt"
    f.write_bytes(b"garbage, not a pickle at all")
    with pytest.raises(CheckpointError) as e:
        checkpoint.load_train_state(tmp_path)
    assert str(e.value).startswith(f"cannot resume: {f} is not a train state torch can read (")
    assert "\n" not in str(e.value) and "Python objects" not in str(e.value) and "PyTorch 2.6" not in str(e.value)
    for message, said in [("invalid load key, 'x'.", "invalid load key, 'x'."), ("", "UnpicklingError")]:
        def load(*args, error=pickle.UnpicklingError(message), **kwargs):
            raise error

        monkeypatch.setattr(torch, "load", load)
        with pytest.raises(CheckpointError) as e:
            checkpoint.load_train_state(tmp_path)
        assert str(e.value) == f"cannot resume: {f} is not a train state torch can read ({said})"


def test_a_train_state_that_would_run_code_is_refused_in_one_line(tmp_path):
    torch.save({"x": Evil()}, tmp_path / "train_state.pt")
    with pytest.raises(CheckpointError, match=r"train_state.pt holds Python objects that loading it would have to "
                                              r"run, so it is refused \(Weights only load failed: .*GLOBAL") as e:
        checkpoint.load_train_state(tmp_path)
    assert "\n" not in str(e.value)


def test_resume_from_a_train_state_cut_short_names_the_file(shapes_dir, tmp_path, capsys):
    run = tmp_path / "run"
    args = ["train", "--data", shapes_dir, "--out", run, "--batch-size", "4", "--eval-images", "2", "--lr", "3e-3",
            *tiny_set_flags()]
    assert vqa([*args, "--max-steps", "1"]) == 0
    cut(run / "last" / "train_state.pt")
    fails(capsys, [*args, "--max-steps", "2", "--resume"],
          rf"cannot resume: {run / 'last' / 'train_state.pt'} is not a complete train state", status=1)
