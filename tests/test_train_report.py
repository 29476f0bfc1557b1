"""--report-to tensorboard: the loss, each group's learning rate, the evaluation scores and captioned validation
pictures land in RUN/tensorboard while metrics.jsonl stays; without the package, one line names the extra."""

from __future__ import annotations

import sys

import pytest
from test_train import fails, losses, train_args

from vqa.cli import main
from vqa.errors import ExtraMissing
from vqa.train.report import Reporter

pytestmark = pytest.mark.slow


def _events(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"images": 0, "scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_tensorboard_gets_the_loss_rates_scores_and_captioned_pictures(shapes_dir, tmp_path):
    pytest.importorskip("tensorboard")
    run = tmp_path / "run"
    assert main(train_args(shapes_dir, run, "--max-steps", "4", "--eval-every", "2", "--report-to", "tensorboard")) == 0
    assert sorted(losses(run)) == [1, 2, 3, 4]  # the JSON Lines log stays
    acc = _events(run / "tensorboard")
    scalars = acc.Tags()["scalars"]
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3, 4]
    assert any(t.startswith("lr/") for t in scalars), scalars
    assert [e.step for e in acc.Scalars("val/vqa_accuracy")] == [2, 4]
    pictures = acc.Tags()["images"]
    assert pictures and all(t.startswith("val_pictures/") for t in pictures)
    assert {e.step for e in acc.Images(pictures[0])} == {2, 4}
    assert acc.Tags()["tensors"]  # the captions, as text


def test_without_tensorboard_one_line_names_the_extra(shapes_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if not installed
    with pytest.raises(ExtraMissing, match=r"vqa\[tensorboard\]"):
        Reporter(tmp_path / "metrics.jsonl", "tensorboard")
    fails(capsys, train_args(shapes_dir, tmp_path / "run", "--max-steps", "2", "--report-to", "tensorboard"),
          r"--report-to tensorboard needs the 'tensorboard' extra", status=1)
