"""One code path for one device or many: under torchrun (WORLD_SIZE set) it joins the process group
(NCCL on CUDA, gloo on CPU); otherwise rank 0 of 1."""

from __future__ import annotations

import datetime
import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as tdist

from . import errors
from .device import pick_device

T = TypeVar("T")


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            tdist.barrier()


def on_main(dist: Dist, fn: Callable[[], T]) -> T | None:
    """Run `fn` on rank 0 alone and tell every rank how it went (one broadcast, which also holds the others
    until rank 0 is done): when it raises, rank 0 raises its error and every other rank an error of the same
    vqa.errors class with the same message, so that no rank waits at a later collective for one that has left.
    Returns `fn`'s result on rank 0, None elsewhere."""
    result, failure = None, None
    if dist.main:
        try:
            result = fn()
        except Exception as e:
            failure = e
    if dist.world > 1:
        box = [None if failure is None else (type(failure).__name__, str(failure))]
        tdist.broadcast_object_list(box, src=0)
        if box[0] is not None and not dist.main:
            name, message = box[0]
            kind = getattr(errors, name, None)
            if isinstance(kind, type) and issubclass(kind, errors.VQAError):
                raise kind(message)
            raise RuntimeError(f"rank 0 failed: {name}: {message}")
    if failure is not None:
        raise failure
    return result


def agree(dist: Dist, failure: BaseException | None) -> None:
    """Every rank learns whether any rank failed: one all_gather, reached by a rank that failed too (it caught
    its error), so no rank waits at a later collective for one that has left. A rank that failed raises its own
    error; the others an error of the same vqa.errors class (any other: VQAError) naming the failed rank."""
    if dist.world > 1:
        every: list = [None] * dist.world
        tdist.all_gather_object(every, None if failure is None else (type(failure).__name__, str(failure)))
        failed = [(r, f) for r, f in enumerate(every) if f]
        if failure is None and failed:
            r, (name, message) = failed[0]
            kind = getattr(errors, name, None)
            kind = kind if isinstance(kind, type) and issubclass(kind, errors.VQAError) else errors.VQAError
            raise kind(f"rank {r} of {dist.world} failed: {name}: {message}")
    if failure is not None:
        raise failure


def setup(device: str = "auto", timeout_minutes: float = 30.0) -> Dist:
    """This process's rank and device; joins the process group under torchrun. `timeout_minutes`: how long a
    collective may wait for the slowest rank (NCCL's default is 10 minutes, shorter than a long evaluation
    or a slow disk's first epoch)."""
    if "WORLD_SIZE" not in os.environ or int(os.environ["WORLD_SIZE"]) == 1:
        return Dist(device=pick_device(device))
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    dev = pick_device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    if not tdist.is_initialized():
        # torch._dynamo (timm imports it) imported after the group starts keeps the group's threads alive past
        # destroy_process_group, into the interpreter's exit, where gloo can abort (SIGABRT): imported first, it does not
        importlib.import_module("torch._dynamo")
        tdist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo",
                                timeout=datetime.timedelta(minutes=timeout_minutes))
    return Dist(rank=rank, world=world, local_rank=local, device=dev)


def cleanup() -> None:
    if tdist.is_initialized():
        tdist.destroy_process_group()
