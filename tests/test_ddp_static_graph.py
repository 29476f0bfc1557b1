"""DDP as training builds it (vqa.train.step.wrap_ddp: gradient_as_bucket_view, static_graph) over 2 gloo
processes: the same parameters as DDP without static_graph and as one process stepping on both ranks' batches,
through micro-batch accumulation (gradients synced on the last micro-batch only) and rows packed across images
whose shapes change every batch. SGD: the comparison then shows summation-order noise as noise (Adam's
division by sqrt(v) would blow up the noise of gradients that are exactly 0 in theory, test_train_ddp.py)."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp
from helpers import tiny_model
from test_packing import items

from vqa.data.collate import collate
from vqa.train.step import StepRunner, wrap_ddp

pytestmark = pytest.mark.slow

STEPS, MICRO = 3, 2


def _steps(model, fwd, ranks: list[int], world: int, ddp=None) -> dict:
    """STEPS optimizer steps of vqa train's StepRunner on the micro-batches of `ranks`; the final weights."""
    cpu = torch.device("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    runner = StepRunner(fwd, opt, torch.amp.GradScaler("cpu", enabled=False), list(model.parameters()), cpu,
                        0.0, None, world, ddp)
    for step in range(STEPS):
        runner([collate(items(model, seed=100 * step + 10 * rank + k, n_images=3), pad_id=0,
                        task_weights={"vqa": 1.0, "caption": 0.5})
                for rank in ranks for k in range(MICRO)])
    return model.state_dict()


def _train(rank: int, world: int, init_file: str, static: bool, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model = tiny_model(seed=0).train()
        ddp = wrap_ddp(model, torch.device("cpu"), static_graph=static)
        assert ddp.static_graph == static and ddp.gradient_as_bucket_view
        weights = _steps(model, ddp, [rank], world, ddp)
        if rank == 0:
            torch.save(weights, out)
        del ddp  # the reducer's threads end before the process group they use
        dist.barrier()  # neither rank tears gloo down while the other still talks (SIGABRT at exit otherwise)
    finally:
        dist.destroy_process_group()


def _run(tmp_path, static: bool) -> dict:
    out = tmp_path / f"static-{static}.pt"
    mp.spawn(_train, args=(2, str(tmp_path / f"init-{static}"), static, str(out)), nprocs=2, join=True)
    return torch.load(out)


def test_static_graph_trains_the_same_parameters_as_without_and_as_one_process(tmp_path):
    with_static, without = _run(tmp_path, True), _run(tmp_path, False)
    model = tiny_model(seed=0).train()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    one = _steps(model, model, [0, 1], 1)  # one process, both ranks' micro-batches
    assert any(not torch.equal(with_static[k], start[k]) for k in start)  # training moved the weights
    for k in without:
        torch.testing.assert_close(with_static[k], without[k], atol=1e-7, rtol=1e-6, msg=k)
        torch.testing.assert_close(with_static[k], one[k], atol=1e-6, rtol=1e-5, msg=k)
