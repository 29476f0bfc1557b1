"""DDP as training builds it (vqa.train.step.wrap_ddp: gradient_as_bucket_view, static_graph) over 2 gloo
processes: the same parameters as DDP without static_graph, through micro-batch accumulation (gradients synced
on the last micro-batch only) and rows packed across images whose shapes change every batch."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp
from helpers import tiny_model
from test_packing import items

from vqa.data.collate import collate
from vqa.data.packing import pack_across
from vqa.train.objective import Objective
from vqa.train.optim import make_optimizer
from vqa.train.step import StepRunner, wrap_ddp

pytestmark = pytest.mark.slow

STEPS, MICRO = 3, 2


def _train(rank: int, world: int, init_file: str, static: bool, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        cpu = torch.device("cpu")
        model = tiny_model(seed=0).train()
        opt = make_optimizer(model, 3e-3, 3e-3, 0.01, kind="adamw")
        ddp = wrap_ddp(Objective(model), cpu, static_graph=static)
        assert ddp.static_graph == static and ddp.gradient_as_bucket_view
        params = [p for g in opt.param_groups for p in g["params"]]
        runner = StepRunner(ddp, opt, torch.amp.GradScaler("cpu", enabled=False), params, cpu,
                            {"vqa": 1.0, "caption": 0.5}, 1.0, None, world, ddp)
        for step in range(STEPS):
            micro = [collate(items(model, seed=100 * step + 10 * rank + k, n_images=3), pad_id=0,
                             pack_rows=pack_across) for k in range(MICRO)]
            runner(micro)
        if rank == 0:
            torch.save(model.state_dict(), out)
    finally:
        dist.destroy_process_group()


def _run(tmp_path, static: bool) -> dict:
    out = tmp_path / f"static-{static}.pt"
    mp.spawn(_train, args=(2, str(tmp_path / f"init-{static}"), static, str(out)), nprocs=2, join=True)
    return torch.load(out)


def test_static_graph_trains_the_same_parameters_as_without(tmp_path):
    with_static, without = _run(tmp_path, True), _run(tmp_path, False)
    start = tiny_model(seed=0).state_dict()
    assert any(not torch.equal(with_static[k], start[k]) for k in start)  # training moved the weights
    for k in without:
        torch.testing.assert_close(with_static[k], without[k], atol=1e-7, rtol=1e-6, msg=k)
