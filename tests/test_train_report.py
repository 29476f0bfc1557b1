"""--report-to tensorboard: the loss, each group's learning rate, the evaluation scores and captioned validation
pictures land in RUN/tensorboard while metrics.jsonl stays; without the package, one line names the extra."""

from __future__ import annotations

import json
import sys
from pathlib import Path

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


class FakeTracker:
    """What wandb and trackio are called with: init, log (with step), Image and finish, recorded."""

    def __init__(self):
        self.inits, self.logs, self.finished = [], [], 0

    def init(self, **kw):
        self.inits.append(kw)

    def log(self, values, step):
        self.logs.append((step, values))

    def Image(self, array, caption):  # noqa: N802 -- the trackers' own name
        return ("image", array.shape, caption)

    def finish(self):
        self.finished += 1


@pytest.mark.parametrize("kind", ["wandb", "trackio"])
def test_a_tracker_gets_the_run_and_resume_continues_it(shapes_dir, tmp_path, monkeypatch, kind):
    fake = FakeTracker()
    monkeypatch.setitem(sys.modules, kind, fake)
    monkeypatch.delenv(f"{kind.upper()}_PROJECT", raising=False)
    run = tmp_path / "run"
    assert main(train_args(shapes_dir, run, "--max-steps", "4", "--eval-every", "2", "--report-to", kind)) == 0
    (first,) = fake.inits
    assert first["project"] == "vqa" and first["resume"] == "allow" and first["config"]["max_steps"] == 4
    ident = json.loads((run / "tracker.json").read_text())[kind]
    assert ident.startswith("run-") and (first["id"] if kind == "wandb" else first["name"]) == ident
    steps = {step: values for step, values in fake.logs if "train/loss" in values}
    assert sorted(steps) == [1, 2, 3, 4] and any(k.startswith("lr/") for k in steps[1])
    assert [s for s, v in fake.logs if "val/vqa_accuracy" in v] == [2, 4]
    pictures = [(s, v) for s, v in fake.logs if any(k.startswith("val_pictures/") for k in v)]
    assert {s for s, _ in pictures} == {2, 4}
    _, shape, caption = next(iter(pictures[0][1].values()))
    assert shape[2] == 3 and isinstance(caption, str) and caption
    assert fake.finished == 1
    monkeypatch.setenv(f"{kind.upper()}_PROJECT", "mine")
    before = len(fake.logs)
    assert main(train_args(shapes_dir, run, "--max-steps", "6", "--resume", "--report-to", kind)) == 0
    again = fake.inits[1]
    assert again["project"] == "mine" and (again["id"] if kind == "wandb" else again["name"]) == ident
    assert min(s for s, v in fake.logs[before:] if "train/loss" in v) == 5  # continues, not from 1


def test_without_the_tracker_one_line_names_the_extra(shapes_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    fails(capsys, train_args(shapes_dir, tmp_path / "run", "--max-steps", "2", "--report-to", "wandb"),
          r"--report-to wandb needs the 'wandb' extra \(wandb is not installed\): pip install 'vqa\[wandb\]'", status=1)


class BrokenTracker(FakeTracker):
    """A tracker whose every call to log fails, as one whose server cannot be reached."""

    def log(self, values, step):
        raise ConnectionError("the tracker's server cannot be reached")


@pytest.mark.parametrize("tracker", [FakeTracker, BrokenTracker])
def test_a_report_that_cannot_show_a_picture_never_ends_the_run(shapes_dir, tmp_path, capsys, monkeypatch, tracker):
    """A validation picture removed after the run began (load_image's InputError) or a tracker that fails: the
    report warns once, in one line, shows what it can, and the run goes on."""
    import shutil

    from vqa.data.sources import open_split

    shutil.copytree(shapes_dir, tmp_path / "data")
    val = open_split(tmp_path / "data", "val")
    first = {}
    for i in range(len(val.captions)):
        first.setdefault(val.captions[i].image_id, val.captions[i].image)
    ids = list(first)[:3]
    fake = tracker()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    (tmp_path / "run").mkdir()
    report = Reporter(tmp_path / "run" / "metrics.jsonl", "wandb")
    Path(first[ids[0]]).unlink()  # removed while the run trains
    capsys.readouterr()
    for step in (2, 4):
        report.log(dict(step=step, loss=1.0))
        report.pictures(step, [dict(image_id=i, caption="a red circle") for i in ids], val)
    report.close()
    warned = [line for line in capsys.readouterr().err.splitlines() if "report could not" in line]
    assert len(warned) == 1, warned
    if tracker is FakeTracker:
        assert str(first[ids[0]]) in warned[0] and "image file not found" in warned[0]
        shown = {k for _, values in fake.logs for k in values if k.startswith("val_pictures/")}
        assert shown == {f"val_pictures/{i}" for i in ids[1:]}  # the others are shown
    else:
        assert "server cannot be reached" in warned[0]
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 2  # the log goes on
