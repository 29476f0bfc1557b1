"""`vqa train --shard fsdp` (vqa.train.sharding): FSDP2 over 2 gloo processes on CPU trains what one unsharded
process trains on the global batch (AdamW, and Muon, whose Newton-Schulz runs on gathered matrices; with LoRA,
activation checkpointing and accumulated micro-batches), its full optimizer state loads back into a sharded
optimizer, its checkpoints are an unsharded run's (the Predictor reads them), and a run stopped after a
checkpoint resumes on the same curve, with 2 processes or, elastically, with 1 (and the other way round)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import torch
import torch.multiprocessing as mp
from helpers import tiny_model
from test_packing import items
from test_train import _torchrun, assert_same_run, losses, run_halted, train_args, weights
from test_train_ddp import assert_same_training, without_key_biases

from vqa.config import TrainConfig
from vqa.data.collate import collate
from vqa.errors import ConfigError
from vqa.train import build, sharding
from vqa.train.optim import make_optimizer
from vqa.train.step import StepRunner

pytestmark = pytest.mark.slow

STEPS, MICRO = 3, 2
SETUPS = {  # the TrainConfig fields of each comparison
    "adamw": dict(optimizer="adamw"),
    "muon-lora-checkpointed": dict(optimizer="muon", lora_rank=2, lora_targets=("self_attn", "mlp", "vit"),
                                   grad_checkpointing=True),
}


def _model_and_optimizer(setup: str, sharded: bool):
    cfg = TrainConfig(**SETUPS[setup])
    model = tiny_model(seed=0).train()
    # LoRA (its base weights frozen: groups mixing frozen and trained) and checkpointing
    build.memory_options(cfg, model)
    if sharded:
        sharding.shard(model)  # the model itself: its forward is the loss
    opt = make_optimizer(model, 3e-3, 1e-3, 0.05, kind=cfg.optimizer)
    return model, opt


def _steps(setup: str, ranks: list[int], world: int, sharded: bool):
    """STEPS optimizer steps of vqa train's StepRunner on MICRO micro-batches of each of `ranks`."""
    model, opt = _model_and_optimizer(setup, sharded)
    params = [p for g in opt.param_groups for p in g["params"]]
    runner = StepRunner(model, opt, torch.amp.GradScaler("cpu", enabled=False), params, torch.device("cpu"),
                        1.0, None, world)
    for step in range(STEPS):
        runner([collate(items(model, seed=100 * step + 10 * rank + k, n_images=3), pad_id=0,
                        task_weights={"vqa": 1.0, "caption": 0.5})
                for rank in ranks for k in range(MICRO)])
    return model, opt


def _groups(state: dict) -> list[dict]:
    """The parameter groups, betas as a tuple (loading makes them a list, which AdamW reads alike)."""
    return [{k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in state["param_groups"]]


def _sharded(rank: int, world: int, init_file: str, setup: str, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model, opt = _steps(setup, [rank], world, sharded=True)
        assert all(sharding.is_sharded(p) for p in model.parameters())
        plain = sharding.plain_copy(model, everywhere=False)  # rank 0 only
        state = sharding.full_optimizer_state(model, opt)
        assert (plain is None) == (state is None) == (rank != 0)
        everywhere = sharding.plain_copy(model, everywhere=True)
        if rank == 0:
            torch.save(dict(weights=plain.state_dict(), optimizer=state), out)
            assert all(torch.equal(v, everywhere.state_dict()[k]) for k, v in plain.state_dict().items())
        dist.barrier()
        saved = torch.load(out, weights_only=True)["optimizer"]
        model2, opt2 = _model_and_optimizer(setup, sharded=True)  # a fresh sharded run resuming it
        sharding.load_optimizer_state(model2, opt2, saved)
        again = sharding.full_optimizer_state(model2, opt2)
        if rank == 0:  # every rank got its part back
            for a, b in [(again, saved)] if "state" in saved else [(again[k], saved[k]) for k in saved]:
                assert _groups(a) == _groups(b)
                torch.testing.assert_close(a["state"], b["state"], rtol=0, atol=0)
        dist.barrier()  # neither rank tears gloo down while the other still talks (SIGABRT at exit otherwise)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("setup", list(SETUPS))
def test_fsdp_on_two_processes_trains_what_one_process_trains_on_both_batches(tmp_path, setup):
    out = tmp_path / "sharded.pt"
    mp.spawn(_sharded, args=(2, str(tmp_path / "init"), setup, str(out)), nprocs=2, join=True)
    sharded = torch.load(out, weights_only=True)
    model, opt = _steps(setup, [0, 1], 1, sharded=False)
    start = tiny_model(seed=0).state_dict()
    one = model.state_dict()
    assert set(sharded["weights"]) == set(one)  # the same names, LoRA adapters included
    assert any(not torch.equal(one[k], start[k]) for k in start if k in one)  # training moved the weights
    a, b = without_key_biases(one), without_key_biases(sharded["weights"])
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=2e-5, rtol=1e-4, msg=k)
    # the optimizer state has the unsharded layout (numbered parameters, full moments): any run resumes it
    ref = opt.state_dict()
    parts = [(ref, sharded["optimizer"])] if "state" in ref else [(ref[k], sharded["optimizer"][k]) for k in ref]
    for r, s in parts:
        assert [g["params"] for g in r["param_groups"]] == [g["params"] for g in s["param_groups"]]
        assert {i: set(st) for i, st in r["state"].items()} == {i: set(st) for i, st in s["state"].items()}
        for i, st in r["state"].items():
            assert all(s["state"][i][k].shape == v.shape for k, v in st.items()), i


def test_fp16_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^--shard fsdp does not take --precision fp16 .*--precision bf16$"):
        TrainConfig(shard="fsdp", precision="fp16")
    assert TrainConfig(shard="fsdp", precision="bf16").shard == "fsdp" and TrainConfig().shard == "ddp"
    with pytest.raises(ConfigError, match=r"^--shard 'zero3': choose one of ddp, fsdp$"):  # from a --config file
        TrainConfig(shard="zero3")


def test_help_says_what_shard_does():
    res = subprocess.run([sys.executable, "-m", "vqa.cli", "train", "--help"], capture_output=True, text=True)
    text = " ".join(res.stdout.split())
    assert "--shard {ddp,fsdp}" in text and "does not fit one device replicated" in text, text[-3000:]


# ---------------------------------------------------------------- the command line under torchrun


def test_fsdp_run_equals_one_process_and_its_checkpoint_is_an_unsharded_runs(shapes_dir, tmp_path):
    # with the grounding loss, whose probe reads the sharded cross-attention outside its forward
    common = ["--max-steps", "3", "--device", "cpu", "--optimizer", "adamw", "--grounding-weight", "1"]
    one = _torchrun(train_args(shapes_dir, tmp_path / "one", *common, "--batch-size", "8"), nproc=1)
    assert one.returncode == 0, one.stderr[-3000:]
    two = _torchrun(train_args(shapes_dir, tmp_path / "two", *common, "--batch-size", "2", "--accum", "2",
                               "--shard", "fsdp"), nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "sharded (FSDP)" in two.stderr and "returned a view tensor" not in two.stderr
    assert "grounding loss (weight 1)" in two.stderr
    assert_same_training(tmp_path / "one", tmp_path / "two")
    for name in ("last", "best"):  # the same files as an unsharded run's
        assert sorted(p.name for p in (tmp_path / "two" / name).iterdir()) == sorted(
            p.name for p in (tmp_path / "one" / name).iterdir())
    from vqa.inference.predict import Predictor

    picture = next((shapes_dir / "val").rglob("*.png"))  # the Predictor reads the sharded run's checkpoint as any
    got = [Predictor.from_pretrained(tmp_path / run, device="cpu").answer(picture, "what shape is it?", top_k=3)
           for run in ("one", "two")]
    assert [a for a, _ in got[1].top_k] == [a for a, _ in got[0].top_k]
    assert [p for _, p in got[1].top_k] == pytest.approx([p for _, p in got[0].top_k], abs=1e-4)


HALT = """
import sys
from vqa import distributed
from vqa.cli import build_parser
from vqa.config import TrainConfig
from vqa.options import given
from vqa.train import Trainer, resolve

args, step = sys.argv[2:], int(sys.argv[1])
d = distributed.setup("cpu")
ns = build_parser(args).parse_args(args)
trainer = Trainer(resolve(given(ns, TrainConfig), ns.config), d)
try:
    trainer.fit(halt_at_step=step)  # stopped right after that step's checkpoint, as if killed there
finally:
    trainer.close()
    distributed.cleanup()
"""


def _halted(tmp_path, args: list[str], step: int, nproc: int) -> None:
    script = tmp_path / "halt.py"
    script.write_text(HALT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--standalone",
           str(script), str(step), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                         env=dict(__import__("os").environ, OMP_NUM_THREADS="1"))
    assert res.returncode == 0, res.stderr[-3000:]


def test_a_stopped_fsdp_run_resumes_on_the_same_curve_with_two_processes_or_one_and_back(shapes_dir, tmp_path):
    common = ["--max-steps", "5", "--device", "cpu", "--optimizer", "adamw", "--eval-images", "0"]
    two = [*common, "--batch-size", "4", "--shard", "fsdp"]
    full = tmp_path / "full"
    res = _torchrun(train_args(shapes_dir, full, *two), nproc=2)
    assert res.returncode == 0, res.stderr[-3000:]
    cut = tmp_path / "cut"
    _halted(tmp_path, train_args(shapes_dir, cut, *two), 2, nproc=2)
    assert max(losses(cut)) == 2
    elastic = tmp_path / "elastic"
    shutil.copytree(cut, elastic)
    res = _torchrun(train_args(shapes_dir, cut, *two, "--resume"), nproc=2)
    assert res.returncode == 0, res.stderr[-3000:]
    assert_same_run(full, cut, 5)
    # the 2-process sharded state, resumed by one process (batch 8: the same global batch)
    res = _torchrun(train_args(shapes_dir, elastic, *common, "--batch-size", "8", "--resume"), nproc=1)
    assert res.returncode == 0, res.stderr[-3000:]
    a, b = losses(full), losses(elastic)
    assert sorted(b) == [1, 2, 3, 4, 5] and all(b[s] == pytest.approx(a[s], rel=1e-4) for s in a)
    wa, wb = without_key_biases(weights(full)), without_key_biases(weights(elastic))
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-5
    # and the other way: one unsharded process's state, resumed sharded over 2 processes
    single = tmp_path / "single"
    run_halted(train_args(shapes_dir, single, *common, "--batch-size", "8"), 2)
    res = _torchrun(train_args(shapes_dir, single, *two, "--resume"), nproc=2)
    assert res.returncode == 0, res.stderr[-3000:]
    a, b = losses(full), losses(single)
    assert sorted(b) == [1, 2, 3, 4, 5] and all(b[s] == pytest.approx(a[s], rel=1e-4) for s in a)
    wa, wb = without_key_biases(weights(full)), without_key_biases(weights(single))
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-5
