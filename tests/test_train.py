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

from vqa.cli import main
from vqa.config import parse_duration
from vqa.data.sampler import epoch_permutation, rank_order
from vqa.errors import CheckpointError, ConfigError
from vqa.model import checkpoint

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
    from vqa.evaluation.evaluate import evaluate

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
    # one answer per question of the split, and the summary is the official score of exactly those answers
    anns = json.loads((shapes_dir / "v2_mscoco_train_annotations.json").read_text())["annotations"]
    assert sorted(r["question_id"] for r in vqa_res) == sorted(a["question_id"] for a in anns)
    assert len(cap_res) == len({a["image_id"] for a in anns})
    from vqa.evaluation.metrics import vqa_accuracy

    answers = {a["question_id"]: [x["answer"] for x in a["answers"]] for a in anns}
    expected = 100 * sum(vqa_accuracy(r["answer"], answers[r["question_id"]]) for r in vqa_res) / len(vqa_res)
    assert summary["vqa_accuracy"] == pytest.approx(expected, abs=0.01)
    assert summary["questions"] == len(vqa_res) and "CIDEr-D" in summary and "per_question_type" in summary
    assert summary["generation"]["vqa"]["method"] == "greedy" and summary["generation"]["vqa"]["max_new_tokens"] == 10


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


def test_every_world_size_and_batch_trains_on_the_same_global_steps():
    n, seed, epoch = 50, 1, 3
    perm = epoch_permutation(n, epoch, seed)
    assert sorted(perm) == list(range(n)) and perm != epoch_permutation(n, epoch + 1, seed)

    def steps(world, batch, accum, start=0):
        """The set of images of each global step, from image `start` of the epoch on."""
        per_rank = [rank_order(n, epoch, seed, start, r, world, batch, accum) for r in range(world)]
        per_step = batch * accum
        count = len(per_rank[0]) // per_step
        return [sorted(i for r in per_rank for i in r[k * per_step : (k + 1) * per_step]) for k in range(count)]

    one = steps(1, 8, 1)
    assert one == [sorted(perm[k * 8 : (k + 1) * 8]) for k in range(n // 8)]  # the remainder (2) is dropped
    assert steps(2, 4, 1) == steps(4, 1, 2) == steps(1, 2, 4) == one
    # a run resumed after 3 steps of 8 continues at image 24 whatever its new layout: nothing skipped or repeated
    assert steps(2, 2, 2, start=24) == one[3:] and steps(1, 4, 1, start=24) == [
        sorted(perm[24 + 4 * k : 28 + 4 * k]) for k in range((n - 24) // 4)]


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
    # the schedule aims at 90-98% of the limit and the clock is checked at every logged step: it ends near
    # the limit, never much after it
    assert state["time_used"] < 25 + 3 and state["step"] >= 0.8 * state["total_steps"]


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


def test_a_finished_run_resumed_with_more_steps_trains_them(shapes_dir, tmp_path):
    run = tmp_path / "run"
    assert main(train_args(shapes_dir, run, "--max-steps", "3")) == 0
    assert main(train_args(shapes_dir, run, "--max-steps", "3", "--resume")) == 0  # finished: nothing to do
    assert sorted(losses(run)) == [1, 2, 3]
    assert main(["train", "--out", str(run), "--resume", "--max-steps", "6"]) == 0  # the saved run, 3 more steps
    assert sorted(losses(run)) == [1, 2, 3, 4, 5, 6]
    assert checkpoint.load_train_state(run / "last")["step"] == 6
    assert json.loads((run / "train_config.json").read_text())["max_steps"] == 6


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
    source = weights(src)
    for k, v in model.state_dict().items():  # lr 0: still the source's weights
        assert torch.equal(v, source[k]), k
    fails(capsys, [*args[:4], str(tmp_path / "dst2"), *args[5:-4], "--set", "dec_width=64"],
          "--set dec_width changes the model's shape")


def test_a_torn_metrics_line_does_not_stop_a_resume(shapes_dir, tmp_path):
    run = tmp_path / "run"
    run_halted(train_args(shapes_dir, run, "--max-steps", "4"), 2)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "loss": 1.2')  # killed in mid-write
    assert main(train_args(shapes_dir, run, "--max-steps", "4", "--resume")) == 0
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert all(json.loads(line) for line in lines) and sorted(losses(run)) == [1, 2, 3, 4]


def test_one_trainer_per_run_folder(shapes_dir, tmp_path, capsys):
    from vqa.train.runlock import RunLock

    run = tmp_path / "run"
    run.mkdir()
    with RunLock(run):  # another process would hold it the same way (flock is per open file)
        fails(capsys, train_args(shapes_dir, run, "--max-steps", "1", "--resume"),
              rf"{run.name} is being trained by process {os.getpid()}")
    assert main(train_args(shapes_dir, run, "--max-steps", "1", "--resume")) == 0  # free again


def test_every_rank_leaves_with_rank_0s_error_when_the_run_folder_is_taken(shapes_dir, tmp_path):
    """Not under torchrun (nothing stops the other ranks for it): rank 0 finds the run folder locked, and
    rank 1 leaves too, with the same one-line message, instead of waiting at the barrier (until --dist-timeout
    with NCCL; gloo notices rank 0 is gone and crashes with a traceback)."""
    import socket

    from vqa.train.runlock import RunLock

    run = tmp_path / "run"
    run.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [sys.executable, "-m", "vqa.cli", *train_args(shapes_dir, run, "--max-steps", "1", "--resume",
                                                         "--device", "cpu", "--dist-timeout", "2")]
    with RunLock(run):
        procs = [subprocess.Popen(args, env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                                                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1"),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
        try:
            outs = [p.communicate(timeout=100) for p in procs]  # a barrier's wait: 2 minutes
        finally:
            for p in procs:
                p.kill()
    for rank, (p, (_, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 2, (rank, err[-2000:])
        assert f"{run.name} is being trained by process {os.getpid()}" in err and "Traceback" not in err, err


def test_checkpoint_saves_use_their_own_temporary_folders(shapes_dir, tmp_path):
    run = tmp_path / "run"
    assert main(train_args(shapes_dir, run, "--max-steps", "1")) == 0
    model, tok, card = checkpoint.load(run / "last")
    stale = run / "last.tmp"  # what a save killed mid-write by an older version left behind
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    checkpoint.save(run / "last", model, tok, card)  # not confused by it
    checkpoint.load(run / "last")
    checkpoint.recover(run / "last")  # the trainer's start-up, under the run lock, clears leftovers
    assert not stale.exists()
    # two processes saving one checkpoint folder at once never share a temporary folder
    code = ("import sys; from vqa import checkpoint; m, t, c = checkpoint.load(sys.argv[1]); "
            "[checkpoint.save(sys.argv[2], m, t, c) for _ in range(15)]")
    target = tmp_path / "shared" / "ckpt"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(run / "last"), str(target)],
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert "SafetensorError" not in "".join(errs) and "Directory not empty" not in "".join(errs), errs


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


def test_a_warmup_as_long_as_the_run_is_shortened(shapes_dir, tmp_path, capsys):
    run = tmp_path / "short"
    capsys.readouterr()
    assert main(train_args(shapes_dir, run, "--max-steps", "10", "--warmup", "100", "--lr", "0.002")) == 0
    assert "--warmup 100 is not shorter than the run's 10 steps; warming up over 1" in capsys.readouterr().err
    lrs = [json.loads(line)["lr"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"lr"' in line]
    assert lrs[0] == pytest.approx(0.002) and lrs[-1] < 0.5 * 0.002  # the peak, then the cosine decay


def test_eval_tasks_are_validated(shapes_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(train_args(shapes_dir, run, "--max-steps", "1", "--tasks", "vqa")) == 0
    base = ["eval", "--checkpoint", str(run), "--data", str(shapes_dir), "--out", str(tmp_path / "e")]
    fails(capsys, [*base, "--tasks", "captions"], r"tasks 'captions': choose vqa, caption")
    fails(capsys, [*base, "--tasks", "vqa, caption"], "trained on vqa only, not caption")
    assert main([*base, "--tasks", " vqa "]) == 0
    summary = json.loads((tmp_path / "e" / "summary.json").read_text())
    assert summary["questions"] > 0 and "CIDEr-D" not in summary


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


def test_caption_weight_and_hflip_reach_the_step_and_the_transform(shapes_dir, tmp_path):
    """--caption-weight is the caption task's weight in every step's loss; --hflip turns on the training
    transform's flips (the transform's own tests check when it flips)."""
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
            assert trainer.runner.weights == {"vqa": 1.0, "caption": weight}
            assert trainer.data.dataset.transform.allow_hflip is flips
        finally:
            trainer.close()


def test_dist_timeout_is_how_long_a_collective_waits_under_torchrun(monkeypatch, tmp_path):
    import datetime

    from vqa.config import TrainConfig
    from vqa.train import train

    asked = []

    class Joined(Exception):
        pass

    def init_process_group(backend, timeout):
        asked.append(timeout)
        raise Joined  # this test needs only what train() asks for

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(torch.distributed, "init_process_group", init_process_group)
    with pytest.raises(Joined):
        train(TrainConfig(data="d", out=str(tmp_path / "run"), device="cpu", dist_timeout=45))
    assert asked == [datetime.timedelta(minutes=45)]
