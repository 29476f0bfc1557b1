"""vqa: visual question answering and captioning with a timm ViT encoder and a cross-attention text decoder.

    from vqa import Predictor
    p = Predictor.from_pretrained("runs/tiny")
    p.answer("image.png", "what color is the circle?", top_k=3)
"""

import os

# OpenMP threads that wait at a barrier sleep instead of spinning: on a machine where other programs run, a
# spinning thread burns the share its descheduled partner needs (docs/results/performance.md, scripts/bench_busy.py).
# Read when torch loads its OpenMP runtime, so it holds wherever vqa is imported before torch; a value the
# user set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
__all__ = ["Predictor", "__version__"]


def __getattr__(name: str):
    # lazy, so `import vqa` (and the CLI's start-up) does not import torch, timm and the model
    if name == "Predictor":
        from .inference.predict import Predictor

        return Predictor
    raise AttributeError(f"module 'vqa' has no attribute {name!r}")
