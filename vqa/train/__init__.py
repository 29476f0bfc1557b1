"""`vqa train`: the training loop, the same code on a laptop CPU and on many GPUs.

    vqa train --data data/shapes --out runs/tiny --preset tiny --time-limit 10m       # one device
    torchrun --nproc_per_node 8 -m vqa.cli train --data DIR --out RUN --preset base  # many GPUs (DDP)
    vqa train --out RUN --resume                                                     # continue where it stopped

Files: `cli` (the options; `train`: one run to its end), `runfolder` (the options resolved from defaults,
presets, config files and a saved run; the run folder's files), `trainer` (the loop), `build` (a new run's
tokenizer and model), `step` (one optimizer step: `model(images, rows)` returns the loss), `optim` (Muon +
AdamW, schedules), `budget` (`--time-limit`), `state` (what resume restores), `report` (metrics, curves,
trackers); `vqa.locks` keeps one trainer per run folder.
"""

from .cli import add_arguments, run, train
from .runfolder import resolve

_LAZY = {"Trainer": "trainer", "read_metrics": "report"}  # torch loads only when one is used


def __getattr__(name: str):
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["add_arguments", "run", "resolve", "Trainer", "train", "read_metrics"]
