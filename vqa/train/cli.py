"""`vqa train`'s command line: the options are TrainConfig's fields (`--help` lists them), resolved in layers
by `vqa.train.runfolder.resolve` (defaults < preset < --config FILE < the saved run < the flags typed); and
`train`, one run to its end."""

from __future__ import annotations

import argparse

from ..config import TrainConfig
from ..data.sources import resolve_splits
from ..options import add_dataclass_arguments, given
from .runfolder import resolve


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Train a model on a data folder or shards, on one device or many (torchrun). Options "
                     "resolve in layers: defaults < the preset's training defaults < --config FILE < the saved "
                     "run (--resume) < the flags typed.")
    p.add_argument("--config", metavar="FILE", help="read options from a JSON or YAML file (flags given too win)")
    add_dataclass_arguments(p, TrainConfig)


def run(args: argparse.Namespace) -> int:
    cfg = resolve(given(args, TrainConfig), args.config)  # option errors before torch loads
    resolve_splits(cfg.data, cfg.train_split, cfg.val_split)  # and a missing data folder or split
    train(cfg)
    return 0


def train(cfg: TrainConfig):
    """Run a training to its end, on this process's rank (`vqa.distributed`), its resources released however it
    ends; returns the Trainer (its `model`, `tok`, `step`). Under several ranks, one that fails ends the others
    with a line naming it (`vqa.distributed.together`)."""
    from .. import distributed  # torch loads only when a run starts
    from .trainer import Trainer

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


__all__ = ["add_arguments", "run", "train"]
