"""Training: exact resume, DDP equivalence, checkpoints, and the clear stops on bad input."""

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

from vqa import checkpoint
from vqa.cli import main
from vqa.errors import CheckpointError, ConfigError
from vqa.train import epoch_order, parse_duration

pytestmark = pytest.mark.slow


def train_args(data, out, *extra):
    return ["train", "--data", str(data), "--out", str(out), "--batch-size", "4", "--warmup", "2",
            "--log-every", "1", "--eval-images", "4", "--lr", "3e-3", *tiny_set_flags(), *extra]


def fails(capsys, args, match: str) -> None:
    """The command exits 2 with a one-line message naming the problem, not a traceback."""
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert re.search(match, err), err[-2000:]
    assert "Traceback" not in err


def losses(run: Path) -> dict[int, float]:
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in recs if "loss" in r}


def weights(run: Path) -> dict[str, torch.Tensor]:
    model, _, _ = checkpoint.load(run / "last")
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_killed_run_resumes_exactly(shapes_dir, tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    drop = ["--set", "dec_dropout=0.1"]  # dropout draws from the RNG: resume must restore it exactly
    assert main(train_args(shapes_dir, full, "--max-steps", "8", *drop)) == 0
    # the same run stopped after step 3 (as if killed right after its checkpoint), then resumed
    assert main(train_args(shapes_dir, cut, "--max-steps", "8", "--halt-at-step", "3", *drop)) == 0
    assert max(losses(cut)) == 3
    # a killed run also leaves log lines after its last checkpoint: they must not survive the resume
    with open(cut / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 4, "loss": 123.0}) + "\n")
    assert main(train_args(shapes_dir, cut, "--max-steps", "8", "--resume", *drop)) == 0
    a, b = losses(full), losses(cut)
    assert sorted(a) == sorted(b) == list(range(1, 9))
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-5, abs=1e-6), step
    wa, wb = weights(full), weights(cut)
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)


def test_run_folder_refuses_to_be_overwritten(shapes_dir, tmp_path, capsys):
    assert main(train_args(shapes_dir, tmp_path / "r", "--max-steps", "1")) == 0
    fails(capsys, train_args(shapes_dir, tmp_path / "r", "--max-steps", "1"), "already holds a run")


def test_checkpoint_round_trip_predicts_identically(shapes_dir, tmp_path):
    from vqa.data.formats import load_split
    from vqa.evaluate import evaluate

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


def test_eval_command_writes_official_result_files(shapes_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(train_args(shapes_dir, run, "--max-steps", "2")) == 0
    out = tmp_path / "eval"
    assert main(["eval", "--checkpoint", str(run), "--data", str(shapes_dir), "--split", "train", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "WARNING" in err and "trained on" in err  # evaluating on the training split is flagged
    vqa_res = json.loads((out / "vqa_results.json").read_text())
    cap_res = json.loads((out / "caption_results.json").read_text())
    assert vqa_res and set(vqa_res[0]) == {"question_id", "answer"}
    assert cap_res and set(cap_res[0]) == {"image_id", "caption"}
    summary = json.loads((out / "summary.json").read_text())
    assert 0 <= summary["vqa_accuracy"] <= 100 and "CIDEr-D" in summary and "per_question_type" in summary


def _torchrun(args: list[str], nproc: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--standalone",
           "-m", "vqa.cli", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def test_ddp_two_processes_equal_one_process_on_the_global_batch(shapes_dir, tmp_path):
    common = ["--max-steps", "3", "--device", "cpu"]
    one = _torchrun(train_args(shapes_dir, tmp_path / "one", *common, "--batch-size", "8"), nproc=1)
    assert one.returncode == 0, one.stderr[-3000:]
    two = _torchrun(train_args(shapes_dir, tmp_path / "two", *common, "--batch-size", "4"), nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert sorted(a) == sorted(b) == [1, 2, 3]
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-4), step
    wa, wb = without_key_biases(weights(tmp_path / "one")), without_key_biases(weights(tmp_path / "two"))
    worst = max((wa[k] - wb[k]).abs().max().item() for k in wa)
    assert worst < 1e-5, worst


def without_key_biases(state: dict) -> dict:
    """The weights minus the attention key biases. Adding q.b_k shifts all of a query's scores equally, which
    softmax ignores, so their true gradient is exactly 0: what they get is float noise that Adam's division by
    sqrt(v) turns into full-size steps, differently for any change of summation order (1 vs 2 processes).
    With QK-norm the same holds for the bias of the keys' LayerNorm (k_norm.bias), left out as well."""
    out = {}
    for k, v in state.items():
        if k.endswith("k_norm.bias"):
            continue
        if k.endswith("qkv.bias"):  # [q | k | v]
            d = v.shape[0] // 3
            v = torch.cat([v[:d], v[2 * d :]])
        elif k.endswith("kv.bias"):  # [k | v]
            v = v[v.shape[0] // 2 :]
        out[k] = v
    return out


def test_epoch_order_deals_the_same_global_batches_to_any_world_size():
    one = epoch_order(10, 3, seed=1, rank=0, world=1)
    r0, r1 = epoch_order(10, 3, 1, 0, 2), epoch_order(10, 3, 1, 1, 2)
    assert sorted(one) == list(range(10))
    # global batch k of 2 ranks x 2 images == batch k of 1 rank x 4 images
    for k in range(2):
        assert sorted(r0[2 * k : 2 * k + 2] + r1[2 * k : 2 * k + 2]) == sorted(one[4 * k : 4 * k + 4])
    assert epoch_order(10, 4, 1, 0, 1) != one  # a new epoch, a new order


def test_bad_inputs_stop_clearly(shapes_dir, tmp_path, capsys):
    fails(capsys, train_args(shapes_dir, tmp_path / "a", "--train-split", "nosuch"), "nosuch.*train|train.*nosuch")
    empty = tmp_path / "empty"
    empty.mkdir()
    fails(capsys, train_args(empty, tmp_path / "b"), str(empty.name))
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
    fails(capsys, train_args(shapes_dir, tmp_path / "nan", "--max-steps", "3", "--lr", "nan"), "loss is nan at step 2")  # step 1 is finite, its update makes the weights NaN


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


def test_ddp_time_limited_run_stops_on_every_rank_together(shapes_dir, tmp_path):
    # each rank fits the schedule and checks the clock; both decisions are agreed, or one rank would stop
    # while the other waits in an all-reduce (the run would hang until the timeout)
    run = tmp_path / "timed"
    res = _torchrun(train_args(shapes_dir, run, "--time-limit", "25s", "--device", "cpu", "--batch-size", "2",
                               "--eval-every", "1000"), nproc=2)
    assert res.returncode == 0, res.stderr[-3000:]
    state = checkpoint.load_train_state(run / "last")
    assert state["total_steps"] is not None and state["step"] <= state["total_steps"]
    assert state["time_used"] < 25 + 30  # the schedule aims at 90% of the limit; it stops near it, not later


def test_a_save_killed_between_its_renames_is_recovered(shapes_dir, tmp_path):
    run = tmp_path / "run"
    assert main(train_args(shapes_dir, run, "--max-steps", "2", "--halt-at-step", "1")) == 0
    (run / "last").rename(run / "last.old")  # died after moving the old copy aside, before the new one landed
    assert checkpoint.resolve(run / "last.old")  # still loadable
    # --resume finds it and continues (not "nothing to resume", and the only good copy is not deleted)
    assert main(train_args(shapes_dir, run, "--max-steps", "2", "--resume")) == 0
    assert checkpoint.load_train_state(run / "last")["step"] == 2
    assert not (run / "last.old").exists()
    assert [s for s in losses(run)] == [1, 2]


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
    from vqa.optim import MUON_LR_SCALE

    run = tmp_path / "m"
    assert main(train_args(shapes_dir, run, "--max-steps", "2", "--halt-at-step", "1")) == 0
    state = checkpoint.load_train_state(run / "last")
    assert state["optimizer_kind"] == "muon"
    muon_lrs = sorted(g["base_lr"] for g in state["optimizer"]["muon"]["param_groups"])
    assert muon_lrs == pytest.approx([MUON_LR_SCALE * 0.3 * 3e-3, MUON_LR_SCALE * 3e-3])
    fails(capsys, train_args(shapes_dir, run, "--max-steps", "2", "--resume", "--optimizer", "adamw"),
          "trained with --optimizer muon")
    assert main(train_args(shapes_dir, run, "--max-steps", "2", "--resume")) == 0


def test_time_limited_schedule_is_refitted_when_steps_slow_down(shapes_dir, tmp_path, monkeypatch):
    """The cosine is fitted to the time limit from the first 20 steps, then refitted every 50: a run whose
    steps get several times slower after step 30 must still reach (nearly) the end of its schedule in time,
    where the first fit alone would have planned ~3x the steps that fit."""
    import time

    from vqa import train

    real = train.Trainer.train_step

    def slowing(self, micro):
        out = real(self, micro)
        time.sleep(0.002 if self.step < 30 else 0.03)
        return out

    monkeypatch.setattr(train.Trainer, "train_step", slowing)
    run = tmp_path / "timed"
    assert main(train_args(shapes_dir, run, "--time-limit", "12s", "--batch-size", "2", "--eval-every", "100000")) == 0
    state = checkpoint.load_train_state(run / "last")
    assert state["step"] >= 0.9 * state["total_steps"], (state["step"], state["total_steps"])
    assert state["time_used"] < 12 + 5
