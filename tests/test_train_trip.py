"""How far a training batch travels: from the loader's batch to the loss's backward, the step runs code from
at most 8 source files under vqa/ (recorded with sys.setprofile over one real step of `vqa train`'s Trainer,
the optimizer's update left out: it is neither forward nor backward), and the loss it steps on is what the
model's own call, `model(images, rows)`, returned."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from test_train_gpu_path import _trainer

import vqa
from vqa.model import VQAModel
from vqa.model.packed import PackedRows
from vqa.train.step import LOSS_SUM

pytestmark = pytest.mark.slow

PACKAGE = Path(vqa.__file__).resolve().parent
OPTIMIZER = str(PACKAGE / "train" / "optim.py")


def _in_optimizer(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename == OPTIMIZER:
            return True
        frame = frame.f_back
    return False


@pytest.fixture(scope="module")
def recorded_step(shapes_dir, tmp_path_factory) -> dict:
    """One step of a Trainer: the (file, function) pairs it ran under vqa/, each call of the model (its
    arguments and what it returned, seen by a forward hook, which fires only through `model(...)`), the
    micro-batches and the step's stats [summed loss, target count]."""
    trainer = _trainer(shapes_dir, tmp_path_factory.mktemp("trip") / "r", optimizer="muon", precision="fp32")
    calls: set[tuple[str, str]] = set()
    model_calls: list[tuple[tuple, object]] = []

    def record(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(str(PACKAGE)) and not _in_optimizer(frame):
            calls.add((str(Path(frame.f_code.co_filename).relative_to(PACKAGE.parent)), frame.f_code.co_name))

    hook = trainer.model.register_forward_hook(lambda module, args, out: model_calls.append((args, out)))
    try:
        micro = next(trainer.batches())  # the loader's batch
        sys.setprofile(record)
        try:
            stats = trainer.train_step(micro)
        finally:
            sys.setprofile(None)
    finally:
        hook.remove()
        trainer.close()
    return dict(calls=calls, model_calls=model_calls, micro=micro, stats=stats, model=trainer.model)


def test_a_training_step_runs_code_from_at_most_8_files(recorded_step):
    calls = recorded_step["calls"]
    files = sorted({f for f, _ in calls})
    assert ("vqa/model/encoder_decoder.py", "forward") in calls  # training calls the model
    assert ("vqa/model/attention.py", "backward") in calls  # the backward was recorded too
    assert len(files) <= 8, sorted(calls)


def test_the_trainer_calls_the_model_and_steps_on_the_loss_it_returns(recorded_step):
    """`VQAModel.forward` is training's loss: the trainer calls the model itself (once a micro-batch, with the
    images and the packed rows), and the step's summed loss is the sum of what those calls returned."""
    assert isinstance(recorded_step["model"], VQAModel)
    model_calls, micro = recorded_step["model_calls"], recorded_step["micro"]
    assert len(model_calls) == len(micro) >= 1
    for (args, out), batch in zip(model_calls, micro, strict=True):
        images, rows = args
        assert images.shape[0] == batch.images.shape[0] and isinstance(rows, PackedRows)
        assert torch.is_tensor(out) and out.ndim == 0 and out.requires_grad  # a loss, with its graph
    returned = sum(out.detach() for _, out in model_calls)
    assert torch.equal(recorded_step["stats"][LOSS_SUM], returned)
