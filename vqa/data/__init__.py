"""The data layer: the built-in synthetic sets (Shapes, Scenes, the pretraining corpus: `synthetic`), readers for
VQA v2 / OK-VQA / COCO captions / JSONL / shards (`readers`), image loading, transforms, and the torch dataset +
collate. Submodules that need torch are imported on first use."""

from __future__ import annotations

import importlib
from typing import Any

from .readers.formats import find_splits, load_split
from .records import CaptionRecord, VQARecord
from .split import SplitData, corpus_texts

_LAZY = {
    "load_image": "images", "MAX_PIXELS": "images", "Preprocess": "preprocess", "model_input": "preprocess",
    "build_transform": "transforms", "ImageTransform": "transforms",
    "ImageTextDataset": "dataset", "collate": "collate", "make_collate": "collate", "ImageTextBatch": "collate",
    "TaskGroup": "collate",
    "generate_shapes": "synthetic.shapes", "generate_scenes": "synthetic.scenes",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CaptionRecord", "SplitData", "VQARecord", "corpus_texts", "find_splits", "load_split", *_LAZY,
]
