"""Training: the options that reach a run (the encoder's learning rate, Muon, --init-from, --caption-weight
and --hflip, a warm-up as long as the run), the time limit's schedule, the eval command, one trainer per run
folder, and the clear stops on bad input. Resuming, DDP and checkpoints have their own files
(test_train_resume.py, test_train_ddp.py, test_train_checkpoints.py); they, test_train_gpu_path.py and
test_data_shards.py take the helpers below from here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_set_flags

from vqa.cli import main
from vqa.config import parse_duration
from vqa.errors import ConfigError
from vqa.identity import checkpoint_identity
from vqa.weights import checkpoint

pytestmark = pytest.mark.slow


def train_args(data, out, *extra):
    return ["train", "--data", str(data), "--out", str(out), "--batch-size", "4", "--warmup", "2",
            "--log-every", "1", "--eval-images", "4", "--lr", "3e-3", *tiny_set_flags(), *extra]


def fails(capsys, args, match: str, status: int = 2) -> None:
    """The command exits `status` (2: usage, 1: a failure while running) with a one-line message naming the
    problem, not a traceback."""
    capsys.readouterr()
    assert main(args) == status
    err = capsys.readouterr().err
    assert re.search(match, err), err[-2000:]
    assert "Traceback" not in err


def run_halted(args: list[str], step: int) -> None:
    """`vqa train ARGS` stopped right after step `step`'s checkpoint, as if killed there."""
    from vqa import distributed
    from vqa.cli import build_parser
    from vqa.config import TrainConfig
    from vqa.options import given
    from vqa.train import Trainer, resolve

    ns = build_parser(args).parse_args(args)
    trainer = Trainer(resolve(given(ns, TrainConfig), ns.config), distributed.Dist())
    try:
        trainer.fit(halt_at_step=step)
    finally:
        trainer.close()


def losses(run: Path) -> dict[int, float]:
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in recs if "loss" in r}


def weights(run: Path) -> dict[str, torch.Tensor]:
    model, _, _ = checkpoint.load(run / "last")
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_same_run(full: Path, cut: Path, steps: int) -> None:
    """Two runs logged the same losses at steps 1..steps and ended with the same weights (an exact resume)."""
    a, b = losses(full), losses(cut)
    assert sorted(a) == sorted(b) == list(range(1, steps + 1))
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-5, abs=1e-6), step
    wa, wb = weights(full), weights(cut)
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)


def _torchrun(args: list[str], nproc: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--standalone",
           "-m", "vqa.cli", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


# ---------------------------------------------------------------- bad input and the run folder


def test_run_folder_refuses_to_be_overwritten(shapes_dir, tmp_path, capsys):
    assert main(train_args(shapes_dir, tmp_path / "r", "--max-steps", "1")) == 0
    fails(capsys, train_args(shapes_dir, tmp_path / "r", "--max-steps", "1"), "already holds a run")


def test_bad_inputs_stop_clearly(shapes_dir, tmp_path, capsys):
    fails(capsys, train_args(shapes_dir, tmp_path / "a", "--train-split", "nosuch"), "nosuch.*train|train.*nosuch",
          status=1)
    empty = tmp_path / "empty"
    empty.mkdir()
    fails(capsys, train_args(empty, tmp_path / "b"), str(empty.name), status=1)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    if os.access(locked, os.W_OK):  # root ignores permissions: use a path under a file instead
        blocker = tmp_path / "file"
        blocker.write_text("x")
        locked = blocker / "run"
    fails(capsys, train_args(shapes_dir, locked), "cannot write to the output folder")
    with pytest.raises(ConfigError, match="time-limit"):
        parse_duration("ten minutes")
    assert parse_duration("10m") == 600 and parse_duration("90s") == 90 and parse_duration("1.5h") == 5400


def test_nan_loss_stops_with_a_clear_message(shapes_dir, tmp_path, capsys):
    fails(capsys, train_args(shapes_dir, tmp_path / "nan", "--max-steps", "3", "--lr", "1e10"), "loss is nan at step 2",
          status=1)  # step 1 is finite, its update makes the weights NaN


def test_one_trainer_per_run_folder(shapes_dir, tmp_path, capsys):
    from vqa.locks import RunLock

    run = tmp_path / "run"
    run.mkdir()
    with RunLock(run):  # another process would hold it the same way (flock is per open file)
        fails(capsys, train_args(shapes_dir, run, "--max-steps", "1", "--resume"),
              rf"{run.name} is being trained by process {os.getpid()}")
    assert main(train_args(shapes_dir, run, "--max-steps", "1", "--resume")) == 0  # free again


# ---------------------------------------------------------------- the eval command


def test_eval_command_writes_official_result_files(shapes_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(train_args(shapes_dir, run, "--max-steps", "2")) == 0
    out = tmp_path / "eval"
    assert main(["eval", "--checkpoint", str(run), "--data", str(shapes_dir), "--split", "train",
                 "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "WARNING" in err and "trained on" in err  # evaluating on the training split is flagged
    vqa_res = json.loads((out / "vqa_results.json").read_text())
    cap_res = json.loads((out / "caption_results.json").read_text())
    assert vqa_res and set(vqa_res[0]) == {"question_id", "answer"}
    assert cap_res and set(cap_res[0]) == {"image_id", "caption"}
    summary = json.loads((out / "summary.json").read_text())
    # one answer per question of the split, and the summary is the official score of exactly those answers
    anns = json.loads((shapes_dir / "v2_mscoco_train_annotations.json").read_text())["annotations"]
    assert sorted(r["question_id"] for r in vqa_res) == sorted(a["question_id"] for a in anns)
    assert len(cap_res) == len({a["image_id"] for a in anns})
    from vqa.evaluation.metrics import vqa_accuracy

    answers = {a["question_id"]: [x["answer"] for x in a["answers"]] for a in anns}
    expected = 100 * sum(vqa_accuracy(r["answer"], answers[r["question_id"]]) for r in vqa_res) / len(vqa_res)
    assert summary["vqa_accuracy"] == pytest.approx(expected, abs=0.01)
    assert summary["questions"] == len(vqa_res) and "CIDEr-D" in summary and "per_question_type" in summary
    # as served
    assert summary["generation"]["vqa"]["method"] == "beam" and summary["generation"]["vqa"]["max_new_tokens"] == 10


def test_eval_tasks_are_validated(shapes_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(train_args(shapes_dir, run, "--max-steps", "1", "--tasks", "vqa")) == 0
    base = ["eval", "--checkpoint", str(run), "--data", str(shapes_dir), "--out", str(tmp_path / "e")]
    fails(capsys, [*base, "--tasks", "captions"], r"tasks 'captions': choose vqa, caption")
    fails(capsys, [*base, "--tasks", "vqa, caption"], "trained on vqa only, not caption")
    assert main([*base, "--tasks", " vqa "]) == 0
    summary = json.loads((tmp_path / "e" / "summary.json").read_text())
    assert summary["questions"] > 0 and "CIDEr-D" not in summary


# ---------------------------------------------------------------- options


def test_encoder_learning_rate_defaults_to_the_presets_fraction_of_lr(shapes_dir, tmp_path):
    def base_lrs(run):
        groups = checkpoint.load_train_state(run / "last")["optimizer"]["param_groups"]
        return sorted({g["base_lr"] for g in groups})

    adamw = ("--optimizer", "adamw")
    assert main(train_args(shapes_dir, tmp_path / "a", "--max-steps", "1", *adamw)) == 0
    assert base_lrs(tmp_path / "a") == pytest.approx([0.3 * 3e-3, 3e-3])  # tiny: the encoder at 0.3 x --lr
    assert main(train_args(shapes_dir, tmp_path / "b", "--max-steps", "1", "--vit-lr", "5e-3", *adamw)) == 0
    assert base_lrs(tmp_path / "b") == pytest.approx([3e-3, 5e-3])  # an explicit --vit-lr wins


def test_tiny_trains_with_muon_by_default_and_resume_keeps_the_optimizer(shapes_dir, tmp_path, capsys):
    from vqa.train.optim import MUON_LR_SCALE

    run = tmp_path / "m"
    run_halted(train_args(shapes_dir, run, "--max-steps", "2"), 1)
    state = checkpoint.load_train_state(run / "last")
    assert state["optimizer_kind"] == "muon"
    muon_lrs = sorted(g["base_lr"] for g in state["optimizer"]["muon"]["param_groups"])
    assert muon_lrs == pytest.approx([MUON_LR_SCALE * 0.3 * 3e-3, MUON_LR_SCALE * 3e-3])
    fails(capsys, train_args(shapes_dir, run, "--max-steps", "2", "--resume", "--optimizer", "adamw"),
          "trained with optimizer=.muon.; it cannot change on --resume")
    assert main(train_args(shapes_dir, run, "--max-steps", "2", "--resume")) == 0


def test_init_from_keeps_the_sources_weights_and_preset_and_applies_set(shapes_dir, tmp_path, capsys):
    src = tmp_path / "src"
    assert main(train_args(shapes_dir, src, "--max-steps", "1")) == 0
    dst = tmp_path / "dst"
    args = ["train", "--data", str(shapes_dir), "--out", str(dst), "--init-from", str(src / "last"),
            "--max-steps", "1", "--lr", "0", "--batch-size", "4", "--set", "dec_dropout=0.3", "--set", "dec_max_len=20"]
    assert main(args) == 0
    model, _, card = checkpoint.load(dst / "last")
    assert (model.cfg.dec_dropout, model.cfg.dec_max_len) == (0.3, 20)
    assert card["preset"] == "tiny" and card["init_from"] == str(src / "last")
    assert card["init_identity"] == checkpoint_identity(src / "last")  # which weights, whatever src holds later
    source = weights(src)
    for k, v in model.state_dict().items():  # lr 0: still the source's weights
        assert torch.equal(v, source[k]), k
    fails(capsys, [*args[:4], str(tmp_path / "dst2"), *args[5:-4], "--set", "dec_width=64"],
          "--set dec_width changes the model's shape")


def test_caption_weight_and_hflip_reach_the_step_and_the_transform(shapes_dir, tmp_path):
    """--caption-weight is the caption task's weight in every step's loss, beside the tiny preset's grounding
    weight (1 on Shapes, which has boxes); --hflip turns on the training transform's flips (the transform's own
    tests check when it flips)."""
    from vqa import distributed
    from vqa.cli import build_parser
    from vqa.config import TrainConfig
    from vqa.options import given
    from vqa.train import Trainer, resolve

    for extra, weight, flips in (((), 0.5, False), (("--caption-weight", "0.25", "--hflip"), 0.25, True)):
        args = train_args(shapes_dir, tmp_path / f"run{weight}", "--max-steps", "1", "--workers", "0", *extra)
        ns = build_parser(args).parse_args(args)
        trainer = Trainer(resolve(given(ns, TrainConfig), ns.config), distributed.Dist())
        try:
            assert trainer.collate.keywords["task_weights"] == {"vqa": 1.0, "caption": weight, "grounding": 1.0}
            assert trainer.data.dataset.transform.allow_hflip is flips
        finally:
            trainer.close()


def test_a_warmup_as_long_as_the_run_is_shortened(shapes_dir, tmp_path, capsys):
    run = tmp_path / "short"
    capsys.readouterr()
    assert main(train_args(shapes_dir, run, "--max-steps", "10", "--warmup", "100", "--lr", "0.002")) == 0
    assert "--warmup 100 is not shorter than the run's 10 steps; warming up over 1" in capsys.readouterr().err
    lrs = [json.loads(line)["lr"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"lr"' in line]
    assert lrs[0] == pytest.approx(0.002) and lrs[-1] < 0.5 * 0.002  # the peak, then the cosine decay


# ---------------------------------------------------------------- the time limit


def test_time_limited_schedule_is_refitted_when_steps_slow_down(shapes_dir, tmp_path, monkeypatch):
    """The cosine is fitted to the time limit from the first 20 steps, then refitted every 50: a run whose
    steps get several times slower after step 30 must still reach (nearly) the end of its schedule in time,
    where the first fit alone would have planned ~3x the steps that fit."""
    import time

    from vqa import train

    real = train.Trainer.train_step

    def slowing(self, micro, extra=()):
        out = real(self, micro, extra)
        time.sleep(0.002 if self.step < 30 else 0.03)
        return out

    monkeypatch.setattr(train.Trainer, "train_step", slowing)
    run = tmp_path / "timed"
    assert main(train_args(shapes_dir, run, "--time-limit", "12s", "--batch-size", "2", "--eval-every", "100000")) == 0
    state = checkpoint.load_train_state(run / "last")
    assert state["step"] >= 0.9 * state["total_steps"], (state["step"], state["total_steps"])
    assert state["time_used"] < 12 + 5


def test_a_time_limited_run_prints_its_steps_and_the_command_that_repeats_them(shapes_dir, tmp_path, capsys):
    """`make demo` prints how far the time limit got and the `--max-steps` command that trains the same
    schedule on any machine; that command, run, trains exactly that many steps."""
    import shlex

    run = tmp_path / "timed"
    capsys.readouterr()
    assert main(train_args(shapes_dir, run, "--time-limit", "4s", "--eval-every", "100000")) == 0
    err = capsys.readouterr().err
    steps = checkpoint.load_train_state(run / "last")["step"]
    text = (run / "max_steps_command.txt").read_text()
    assert text.startswith(f"--time-limit 4s reached step {steps} (4 images a step)") and text.strip() in err
    words = shlex.split(text.splitlines()[1])
    assert words[:2] == ["vqa", "train"] and words[words.index("--max-steps") + 1] == str(steps)
    assert words[words.index("--out") + 1] == f"{run}-{steps}" and "--time-limit" not in words
    assert main(words[1:]) == 0
    assert checkpoint.load_train_state(Path(f"{run}-{steps}") / "last")["step"] == steps
    assert not (Path(f"{run}-{steps}") / "max_steps_command.txt").exists()  # a run by steps has nothing to add
