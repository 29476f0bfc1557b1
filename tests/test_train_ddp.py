"""Training over several processes: two DDP processes equal one process on the global batch, every world size
and batch trains on the same global steps, a time-limited run stops on every rank together, every rank leaves
with rank 0's error when the run folder is taken, and --dist-timeout is how long a collective waits."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from test_train import _torchrun, losses, train_args, weights

from vqa.data.sampler import epoch_permutation, rank_order
from vqa.weights import checkpoint

pytestmark = pytest.mark.slow


def test_ddp_two_processes_equal_one_process_on_the_global_batch(shapes_dir, tmp_path):
    common = ["--max-steps", "3", "--device", "cpu"]
    one = _torchrun(train_args(shapes_dir, tmp_path / "one", *common, "--batch-size", "8"), nproc=1)
    assert one.returncode == 0, one.stderr[-3000:]
    two = _torchrun(train_args(shapes_dir, tmp_path / "two", *common, "--batch-size", "4"), nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    assert_same_training(tmp_path / "one", tmp_path / "two")


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


def test_every_rank_leaves_with_rank_0s_error_when_the_run_folder_is_taken(shapes_dir, tmp_path):
    """Not under torchrun (nothing stops the other ranks for it): rank 0 finds the run folder locked, and
    rank 1 leaves too, with the same one-line message, instead of waiting at the barrier (until --dist-timeout
    with NCCL; gloo notices rank 0 is gone and crashes with a traceback)."""
    import socket

    from vqa.locks import RunLock

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


def assert_same_training(one, two):
    """Two runs of 3 steps (one process and several) logged the same losses and ended with the same weights."""
    a, b = losses(one), losses(two)
    assert sorted(a) == sorted(b) == [1, 2, 3]
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-4), step
    wa, wb = without_key_biases(weights(one)), without_key_biases(weights(two))
    worst = max((wa[k] - wb[k]).abs().max().item() for k in wa)
    assert worst < 1e-5, worst
