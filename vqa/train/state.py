"""What `--resume` restores beyond the weights: optimizer, scaler, step, data position, schedule, RNGs.

Saved as `train_state.pt` in `last/` (read back with `weights_only=True`). The data position is a count of
images of the epoch's global order (see `sampler`), so it means the same thing for any world size.
"""

from __future__ import annotations

import random

import torch

from .. import distributed
from ..errors import ConfigError
from . import sharding


def rng_state(dist: distributed.Dist) -> dict:
    """Python's and torch's generators; on CUDA every rank's own generator, gathered on rank 0."""
    cuda = None
    if dist.device.type == "cuda":
        cuda = [torch.cuda.get_rng_state(dist.device)]
        if dist.world > 1:
            cuda = [None] * dist.world
            torch.distributed.all_gather_object(cuda, torch.cuda.get_rng_state(dist.device))
    return dict(python_rng=random.getstate(), torch_rng=torch.get_rng_state(), cuda_rng=cuda)


def restore_rng(state: dict, dist: distributed.Dist) -> str | None:
    """Put the saved generators back; returns a warning when the CUDA ones cannot be (another world size or a
    CPU-saved run), else None."""
    random.setstate(state["python_rng"])
    torch.set_rng_state(state["torch_rng"])
    if dist.device.type != "cuda":
        return None
    cuda = state.get("cuda_rng")
    if cuda is not None and len(cuda) == dist.world:
        torch.cuda.set_rng_state(cuda[dist.rank], dist.device)  # this rank's own generator
        return None
    saved = "no CUDA generator" if cuda is None else f"{len(cuda)} CUDA generators"
    return (f"the run was saved with {saved} and resumes on {dist.world} GPU(s): dropout masks will differ "
            "from an uninterrupted run (the data order does not)")


def restore_optimizer(optimizer, state: dict, kind: str, out, sharded_root=None) -> None:
    """The saved optimizer state into `optimizer`, keeping the base rates and weight decay given now.
    `sharded_root`: the FSDP root of a sharded run (`vqa.train.sharding`), where each rank keeps its part of
    the saved full state, whatever the world size and --shard that saved it."""
    saved = state.get("optimizer_kind", "adamw")
    if saved != kind:
        raise ConfigError(f"{out} was trained with --optimizer {saved}; resume it with the same, not {kind}")
    fresh = [(g["base_lr"], g["weight_decay"]) for g in optimizer.param_groups]
    if sharded_root is not None:
        sharding.load_optimizer_state(sharded_root, optimizer, state["optimizer"])
    else:
        optimizer.load_state_dict(state["optimizer"])
    for g, (base_lr, wd) in zip(optimizer.param_groups, fresh, strict=True):
        g["base_lr"], g["weight_decay"] = base_lr, wd  # --lr / --weight-decay given now win


def data_position(state: dict, images_per_step: int) -> tuple[int, int]:
    """(epoch, images of the epoch's global order already trained on); older states counted batches."""
    if "image_in_epoch" in state:
        return int(state["epoch"]), int(state["image_in_epoch"])
    return int(state["epoch"]), int(state.get("batch_in_epoch", 0)) * images_per_step


__all__ = ["rng_state", "restore_rng", "restore_optimizer", "data_position"]
