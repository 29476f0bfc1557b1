"""`train`: one training run to its end, on this process's rank (`vqa.distributed`), its resources released
however it ends."""

from __future__ import annotations

from .. import distributed
from ..config import TrainConfig
from .trainer import Trainer


def train(cfg: TrainConfig) -> Trainer:
    """Run a training to its end; returns the Trainer (its `model`, `tok`, `step`). Under several ranks, one
    that fails ends the others with a line naming it (`vqa.distributed.together`)."""
    dist, made = distributed.setup(cfg.device, timeout_minutes=cfg.dist_timeout), []

    def work() -> Trainer:
        made.append(Trainer(cfg, dist))
        made[0].fit()
        return made[0]

    def release() -> None:
        if made:
            made[0].close()
        distributed.cleanup()

    return distributed.together(dist, work, release)


__all__ = ["train"]
