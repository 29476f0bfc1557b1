"""How far a training batch travels: from the loader's batch to the loss's backward, the step runs code from
at most 8 source files under vqa/ (recorded with sys.setprofile over one real step of `vqa train`'s Trainer,
the optimizer's update left out: it is neither forward nor backward)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_train_gpu_path import _trainer

import vqa

pytestmark = pytest.mark.slow

PACKAGE = Path(vqa.__file__).resolve().parent
OPTIMIZER = str(PACKAGE / "train" / "optim.py")


def _in_optimizer(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename == OPTIMIZER:
            return True
        frame = frame.f_back
    return False


def test_a_training_step_runs_code_from_at_most_8_files(shapes_dir, tmp_path):
    trainer = _trainer(shapes_dir, tmp_path / "r", optimizer="muon", precision="fp32")
    calls: set[tuple[str, str]] = set()

    def record(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(str(PACKAGE)) and not _in_optimizer(frame):
            calls.add((str(Path(frame.f_code.co_filename).relative_to(PACKAGE.parent)), frame.f_code.co_name))

    try:
        micro = next(trainer.batches())  # the loader's batch
        sys.setprofile(record)
        try:
            trainer.train_step(micro)
        finally:
            sys.setprofile(None)
    finally:
        trainer.close()
    files = sorted({f for f, _ in calls})
    assert ("vqa/model/encoder_decoder.py", "packed_loss") in calls  # training calls the model
    assert ("vqa/model/attention.py", "backward") in calls  # the backward was recorded too
    assert len(files) <= 8, sorted(calls)
