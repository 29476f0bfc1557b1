"""Resuming training: a killed run resumes exactly, a save killed between its renames is recovered, a finished
run trains the steps added, a torn metrics line does not stop a resume, and a time-limited run resumes onto
the time it has left."""

from __future__ import annotations

import json

import pytest
import torch
from test_train import assert_same_run, losses, run_halted, train_args

from vqa.cli import main
from vqa.weights import checkpoint

pytestmark = pytest.mark.slow


def test_killed_run_resumes_exactly(shapes_dir, tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    drop = ["--set", "dec_dropout=0.1"]  # dropout draws from the RNG: resume must restore it exactly
    assert main(train_args(shapes_dir, full, "--max-steps", "8", *drop)) == 0
    # the same run stopped after step 3 (as if killed right after its checkpoint), then resumed
    run_halted(train_args(shapes_dir, cut, "--max-steps", "8", *drop), 3)
    assert max(losses(cut)) == 3
    # a killed run also leaves log lines after its last checkpoint: they must not survive the resume
    with open(cut / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 4, "loss": 123.0}) + "\n")
    assert main(train_args(shapes_dir, cut, "--max-steps", "8", "--resume", *drop)) == 0
    assert_same_run(full, cut, 8)


def test_a_save_killed_between_its_renames_is_recovered(shapes_dir, tmp_path):
    run = tmp_path / "run"
    run_halted(train_args(shapes_dir, run, "--max-steps", "2"), 1)
    (run / "last").rename(run / "last.old")  # died after moving the old copy aside, before the new one landed
    assert checkpoint.resolve(run / "last.old")  # still loadable
    # --resume finds it and continues (not "nothing to resume", and the only good copy is not deleted)
    assert main(train_args(shapes_dir, run, "--max-steps", "2", "--resume")) == 0
    assert checkpoint.load_train_state(run / "last")["step"] == 2
    assert not (run / "last.old").exists()
    assert [s for s in losses(run)] == [1, 2]


def test_a_finished_run_resumed_with_more_steps_trains_them(shapes_dir, tmp_path):
    run = tmp_path / "run"
    assert main(train_args(shapes_dir, run, "--max-steps", "3")) == 0
    assert main(train_args(shapes_dir, run, "--max-steps", "3", "--resume")) == 0  # finished: nothing to do
    assert sorted(losses(run)) == [1, 2, 3]
    assert main(["train", "--out", str(run), "--resume", "--max-steps", "6"]) == 0  # the saved run, 3 more steps
    assert sorted(losses(run)) == [1, 2, 3, 4, 5, 6]
    assert checkpoint.load_train_state(run / "last")["step"] == 6
    assert json.loads((run / "train_config.json").read_text())["max_steps"] == 6


def test_a_torn_metrics_line_does_not_stop_a_resume(shapes_dir, tmp_path):
    run = tmp_path / "run"
    run_halted(train_args(shapes_dir, run, "--max-steps", "4"), 2)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "loss": 1.2')  # killed in mid-write
    assert main(train_args(shapes_dir, run, "--max-steps", "4", "--resume")) == 0
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert all(json.loads(line) for line in lines) and sorted(losses(run)) == [1, 2, 3, 4]


def test_a_time_limited_run_resumes_onto_the_time_it_has_left(shapes_dir, tmp_path):
    """Killed after using most of its budget (here: 57 of 60 s, set in its saved state), a resumed
    time-limited run trains only for what is left, not a fresh 60 s."""
    import time

    run = tmp_path / "timed"
    args = train_args(shapes_dir, run, "--time-limit", "60s", "--batch-size", "2", "--eval-every", "100000")
    run_halted(args, 25)
    state = checkpoint.load_train_state(run / "last")
    assert state["step"] == 25 and state["total_steps"] is not None  # fitted after 20 steps
    state["time_used"] = 57.0
    torch.save(state, run / "last" / "train_state.pt")
    t0 = time.time()
    assert main([*args, "--resume"]) == 0
    wall = time.time() - t0
    after = checkpoint.load_train_state(run / "last")
    assert after["step"] > 25 and 57.0 < after["time_used"] < 60 + 3
    assert wall < 3 + 10, wall  # about 3 s of training left (+ start-up and the final evaluation), not 60
    assert sorted(losses(run)) == sorted(set(losses(run)))  # no step logged twice
