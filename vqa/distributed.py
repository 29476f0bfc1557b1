"""One code path for one device or many: under torchrun (WORLD_SIZE set) it joins the process group
(NCCL on CUDA, gloo on CPU); otherwise rank 0 of 1."""

from __future__ import annotations

import datetime
import importlib
import os
import time
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


def together(dist: Dist, work: Callable[[], T], release: Callable[[], None], wait_s: float = 60.0) -> T:
    """`work()`, then `release()` (its resources, then the process group) however it ends. Under several ranks
    a rank that fails leaves word in the group's store (`vqa/failed/RANK`: the error's class and message) before
    it releases the group, then waits up to `wait_s` for every other rank to have failed too or read it. A rank
    whose collective breaks because another left (gloo: "Connection closed by peer") raises that rank's error
    instead of its own: an error of the same vqa.errors class (any other: VQAError) naming the failed rank, as
    `agree` does, so every rank ends with one line saying which failed, not a traceback."""
    released = False

    def release_once() -> None:
        nonlocal released
        if not released:
            released = True
            release()

    try:
        return work()
    except Exception as e:
        if dist.world == 1:
            raise
        store = _store()
        other = None if isinstance(e, errors.VQAError) else _failure_of_another(dist, store, wait_s=2.0)
        if other is not None:
            _post(store, f"vqa/seen/{dist.rank}", atexit_only=True)  # the failed rank may leave once this one has
            raise other from None
        _post(store, f"vqa/failed/{dist.rank}", f"{type(e).__name__}: {e}")
        release_once()  # the other ranks' collectives with this one break now
        _wait_for_others(dist, store, wait_s)
        raise
    finally:
        release_once()


def _store():
    """The process group's key-value store (torchrun's, or rank 0's TCPStore); None when there is none."""
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 -- no group, or a torch without it: no word passes
        return None


def _post(store, key: str, value: str = "1", atexit_only: bool = False) -> None:
    """Set `key` in the store now (or as this process exits), if the store can still be reached."""
    import atexit

    def post() -> None:
        try:
            store.set(key, value)
        except Exception:  # noqa: BLE001 -- the rank that held the store has left
            pass

    if store is not None and atexit_only:
        atexit.register(post)
    elif store is not None:
        post()


def _failure_of_another(dist: Dist, store, wait_s: float) -> errors.VQAError | None:
    """The error another rank left in the store (waiting up to `wait_s` for one), as this rank's error."""
    deadline = time.monotonic() + wait_s
    while store is not None:
        try:
            for r in range(dist.world):
                if r != dist.rank and store.check([f"vqa/failed/{r}"]):
                    name, _, message = store.get(f"vqa/failed/{r}").decode().partition(": ")
                    kind = getattr(errors, name, None)
                    kind = kind if isinstance(kind, type) and issubclass(kind, errors.VQAError) else errors.VQAError
                    return kind(f"rank {r} of {dist.world} failed: {name}: {message}")
        except Exception:  # noqa: BLE001 -- the store has gone with the rank that held it
            return None
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)
    return None


def _wait_for_others(dist: Dist, store, wait_s: float) -> None:
    """Until every other rank has failed too or read this rank's word (or `wait_s` has passed)."""
    deadline = time.monotonic() + wait_s
    left = {r for r in range(dist.world) if r != dist.rank}
    while store is not None and left and time.monotonic() < deadline:
        try:
            left = {r for r in left if not store.check([f"vqa/failed/{r}"]) and not store.check([f"vqa/seen/{r}"])}
        except Exception:  # noqa: BLE001 -- the store has gone
            return
        time.sleep(0.05)


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
        # destroy_process_group, into the interpreter's exit, where gloo can abort (SIGABRT): imported first,
        # it does not
        importlib.import_module("torch._dynamo")
        tdist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo",
                                timeout=datetime.timedelta(minutes=timeout_minutes))
    return Dist(rank=rank, world=world, local_rank=local, device=dev)


def cleanup() -> None:
    if tdist.is_initialized():
        tdist.destroy_process_group()
