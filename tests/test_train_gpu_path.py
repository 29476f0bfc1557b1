"""The GPU training path, proven on the CPU: a step that never waits for the device, torch.compile without
graph breaks and with few graphs, autocast and the GradScaler resuming in every optimizer/precision
combination, encoders whose pooling heads would leave DDP parameters without gradients, and evaluation
shared by the ranks of a 2-process (gloo) run that then resumes on one process."""

from __future__ import annotations

import json

import pytest
import torch
from test_train import _torchrun, losses, run_halted, train_args, weights

from vqa import distributed
from vqa.cli import main
from vqa.train import Trainer, resolve
from vqa.train.step import count_syncs, host_tensors
from vqa.weights import checkpoint

pytestmark = pytest.mark.slow

SMALL = dict(vit_width=32, vit_depth=1, vit_heads=2, vit_image_size=32, vit_patch_size=8, dec_width=32, dec_depth=1,
             dec_heads=2, dec_max_len=40)


def _trainer(shapes_dir, out, **flags) -> Trainer:
    base = dict(data=str(shapes_dir), out=str(out), batch_size=4, max_steps=6, log_every=1, eval_images=4, model=SMALL,
                from_scratch=True)
    return Trainer(resolve({**base, **flags}), distributed.Dist())


@pytest.mark.parametrize("optimizer,precision", [("adamw", "fp32"), ("muon", "fp32"), ("muon", "bf16")])
def test_a_training_step_never_waits_for_the_device(shapes_dir, tmp_path, optimizer, precision):
    """No .item(), no nonzero, no boolean-mask indexing in a step: counted, since on a CPU they cost nothing.
    (AdamW's step counters live on the host by design and are not device syncs.)"""
    trainer = _trainer(shapes_dir, tmp_path / "r", optimizer=optimizer, precision=precision)
    try:
        batches = trainer.batches()
        trainer.train_step(next(batches))  # optimizer state exists from here on
        micro = next(batches)  # the batch is made (on the host) outside the count
        with count_syncs(ignore=host_tensors(trainer.optimizer)) as c:
            stats = trainer.train_step(micro)
        assert c.count == 0, c.ops
        assert torch.isfinite(stats).all() and stats[1] > 0  # [loss sum, target count]
        # the counter does see a sync: reading the loss, as the loop does at logged steps
        with count_syncs() as c:
            float(stats[0])
        assert c.count == 1
    finally:
        trainer.close()


def test_compile_holds_without_graph_breaks_and_with_few_graphs(shapes_dir, tmp_path):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    trainer = _trainer(shapes_dir, tmp_path / "c", compile=True, max_steps=12)  # two epochs of 6 steps
    try:
        batches = trainer.batches()
        for _ in range(12):
            trainer.train_step(next(batches))
        assert trainer.epoch == 1  # a whole epoch and a second one were seen
    finally:
        trainer.close()
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert 1 <= counters["stats"]["unique_graphs"] <= 4, dict(counters["stats"])  # rows/lengths padded to 8s


def test_encoders_with_a_pooling_head_leave_no_parameter_without_a_gradient():
    """SigLIP's attention pool (and the fc_norm of *_gap_* models) sit after forward_features: unused, they
    would get no gradient and DDP would stop at step 2. The encoder drops them."""
    from helpers import random_images

    from vqa.config import ModelConfig
    from vqa.data.collate import collate
    from vqa.model import VQAModel

    cfg = ModelConfig(vit_name="vit_base_patch16_siglip_224", vit_width=32, vit_depth=1, vit_heads=2,
                      vit_image_size=32, vit_patch_size=8, dec_width=32, dec_depth=1, dec_heads=2, vocab_size=50)
    model = VQAModel(cfg)
    assert model.vision.vit.attn_pool is None
    images = random_images(1, cfg)
    batch = collate([dict(image=images[0], rows=[dict(input_ids=[1, 5, 6, 7, 2], loss_mask=[False] * 3 + [True] * 2,
                                                     task="vqa", meta={}, prompt_len=3)])], pad_id=0,
                    task_weights={"vqa": 1.0})
    model(batch.images, batch.packed).backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, missing


@pytest.mark.parametrize("precision,optimizer", [("fp16", "adamw"), ("bf16", "adamw"), ("fp16", "muon"),
                                                 ("fp32", "muon")])
def test_every_precision_and_optimizer_resumes_exactly(shapes_dir, tmp_path, precision, optimizer):
    common = ("--max-steps", "4", "--precision", precision, "--optimizer", optimizer)
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main(train_args(shapes_dir, full, *common)) == 0
    run_halted(train_args(shapes_dir, cut, *common), 2)
    if precision == "fp16":  # the GradScaler's state is part of what resumes
        assert checkpoint.load_train_state(cut / "last")["scaler"]["scale"] > 0
    assert main(train_args(shapes_dir, cut, *common, "--resume")) == 0
    a, b = losses(full), losses(cut)
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    assert all(b[s] == pytest.approx(a[s], rel=1e-5, abs=1e-6) for s in a), (a, b)
    wa, wb = weights(full), weights(cut)
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)


def test_two_processes_share_the_evaluation_and_resume_on_one(shapes_dir, tmp_path):
    """Both ranks decode half the val images; rank 0's scores equal a single-process evaluation of the same
    checkpoint. The run then resumes on one process with twice the batch: it continues at the same image."""
    from vqa.data.readers.formats import load_split
    from vqa.evaluation.evaluate import evaluate

    run = tmp_path / "ddp"
    res = _torchrun(train_args(shapes_dir, run, "--max-steps", "2", "--device", "cpu", "--batch-size", "2",
                               "--eval-images", "8"), nproc=2)
    assert res.returncode == 0, res.stderr[-3000:]
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in recs if "val_vqa_accuracy" in r and r["step"] == 2][-1]
    model, tok, _ = checkpoint.load(run / "last")
    alone = evaluate(model, tok, load_split(shapes_dir, "val"), max_images=8, progress=False)["summary"]
    assert val["val_images"] == alone["images"] == 8 and val["val_questions"] == alone["questions"]
    assert val["val_vqa_accuracy"] == pytest.approx(alone["vqa_accuracy"]) and val["val_CIDEr-D"] == pytest.approx(
        alone["CIDEr-D"])
    state = checkpoint.load_train_state(run / "last")
    assert (state["epoch"], state["image_in_epoch"]) == (0, 8)  # 2 steps x 2 ranks x 2 images
    assert main(train_args(shapes_dir, run, "--max-steps", "3", "--batch-size", "4", "--resume")) == 0
    state = checkpoint.load_train_state(run / "last")
    assert (state["step"], state["epoch"], state["image_in_epoch"]) == (3, 0, 12)


def test_images_per_gpu_follow_the_gpus_memory_and_the_cpu_keeps_32(monkeypatch):
    """--batch-size not given: the largest power of two (up to 256) whose estimated memory fits 60% of the GPU;
    32 on a CPU. small (36 M parameters, ~52 MB an image by the estimate): 256 on 80 GB, 64 on 8 GB."""
    from types import SimpleNamespace

    from vqa.config import preset
    from vqa.model import VQAModel
    from vqa.train.build import default_batch

    model = VQAModel(preset("small", vocab_size=1000))
    assert default_batch(model, torch.device("cpu")) == 32
    sizes = {}
    for gb in (8, 24, 80):
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda d, gb=gb: SimpleNamespace(total_memory=gb * 1e9))
        sizes[gb] = default_batch(model, torch.device("cuda"))
    assert sizes == {8: 64, 24: 256, 80: 256}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(total_memory=1e9))
    assert default_batch(model, torch.device("cuda")) == 8  # never below 8


def test_loader_workers_share_the_nodes_cores_among_its_gpus(monkeypatch):
    from vqa.train.build import default_workers

    assert default_workers(torch.device("cpu")) == 0
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(96)), raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert default_workers(torch.device("cuda")) == 11  # 96 / 8 - 1 for the training process
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert default_workers(torch.device("cuda")) == 16  # at most 16
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert default_workers(torch.device("cuda")) == 1
