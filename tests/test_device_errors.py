"""`--device` names a device this machine has, or the command stops in one line saying so, before anything
loads: never torch's own "Expected one of cpu, cuda, ..." or "Found no NVIDIA driver", and never blamed on the
checkpoint. (CUDA and MPS are faked away, so these run the same on a machine with a GPU.)"""

from __future__ import annotations

import pytest
import torch
from cli_fixtures import fails
from predict_fixtures import shared_checkpoint, write_pictures

from vqa.device import pick_device
from vqa.errors import ConfigError

NO_CUDA = r"--device cuda: no CUDA GPU is available here \(torch.cuda.is_available\(\) is False\)"


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


@pytest.mark.parametrize("name, match", [
    ("banana", r"--device banana: not a device; use cpu, cuda, cuda:N, mps or auto"),
    ("cuda:x", r"--device cuda:x: not a device"),
    ("cuda", NO_CUDA),
    ("cuda:1", r"--device cuda:1: no CUDA GPU is available here"),
    ("mps", r"--device mps: Apple's MPS is not available here"),
    ("meta", r"--device meta: vqa runs on cpu, cuda, cuda:N or mps"),
])
def test_pick_device_refuses_a_name_that_is_no_device_here(no_gpu, name, match):
    with pytest.raises(ConfigError, match=match):
        pick_device(name)
    assert pick_device("cpu") == torch.device("cpu") and pick_device("auto") == torch.device("cpu")


def test_a_gpu_index_past_the_machines_gpus_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert pick_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(ConfigError, match=r"--device cuda:2: this machine has 2 CUDA GPU\(s\), cuda:0 to cuda:1"):
        pick_device("cuda:2")


@pytest.mark.parametrize("command", ["ask", "caption"])
def test_ask_and_caption_say_the_gpu_is_missing_not_that_the_checkpoint_is_bad(no_gpu, tmp_path, capsys, command):
    img = write_pictures(tmp_path)["red_circle"]
    inputs = [img, "what color is the shape?"] if command == "ask" else [img]
    err = fails(capsys, [command, "--checkpoint", shared_checkpoint(), "--device", "cuda", *inputs], NO_CUDA)
    assert "does not fit" not in err and "safetensors" not in err
    fails(capsys, [command, "--checkpoint", shared_checkpoint(), "--device", "banana", *inputs],
          r"--device banana: not a device")
    fails(capsys, [command, "--checkpoint", shared_checkpoint(), "--device", "cuda", tmp_path, *inputs[1:]],
          NO_CUDA)  # a collection too


def test_eval_and_train_refuse_a_device_before_loading(no_gpu, shapes_dir, tmp_path, capsys):
    fails(capsys, ["eval", "--checkpoint", shared_checkpoint(), "--data", shapes_dir, "--device", "banana"],
          r"--device banana: not a device")
    fails(capsys, ["eval", "--checkpoint", tmp_path / "no-such-run", "--data", shapes_dir, "--device", "cuda"],
          NO_CUDA)  # the device is checked first: the missing checkpoint is not reached
    fails(capsys, ["train", "--data", shapes_dir, "--out", tmp_path / "run", "--max-steps", "1", "--device", "cuda"],
          NO_CUDA)
