"""Is a picture like the ones the model was trained on? A nearest-neighbour check in the model's own eyes.

A model trained on the built-in Shapes set answers a question about a photograph as confidently as one about
a Shapes scene; the answer means little. The demo warns when a picture is unlike the training pictures:

    ref = Familiarity.from_data(predictor, "data/shapes", split="train")   # 256 training pictures
    ref.ratio(predictor.image_features(["photo.jpg"]))                     # [1.9]: > 1 means unusual

Each picture becomes one vector: the mean of its encoded image tokens (the memory the decoder reads),
L2-normalised. Its distance to the nearest of the reference training pictures (1 - cosine similarity) is
compared with the largest such distance *among* the reference pictures, each to its nearest other one (the
leave-one-out nearest-neighbour distance), with a 25% margin: a picture farther from every training picture
than 1.25 x the farthest any training picture lies from the rest gets ratio > 1. This is the deep nearest-
neighbour test of Sun et al. (2022, "Out-of-distribution detection with deep nearest neighbors") with the
threshold taken from the reference itself. It is a warning, not a guarantee: a drawing close to the
training style (a red ball and a blue box on a table, for a Shapes model) may pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError


class Familiarity:
    margin = 1.25  # the threshold is this many times the largest nearest-neighbour distance among the reference

    def __init__(self, reference: np.ndarray, source: str = ""):
        ref = np.asarray(reference, dtype=np.float32)
        if ref.ndim != 2 or ref.shape[0] < 2:
            raise InputError(f"a familiarity reference needs at least 2 feature vectors [R, D], got {ref.shape}")
        self.reference = ref / np.linalg.norm(ref, axis=1, keepdims=True).clip(min=1e-12)
        self.source = source
        sim = self.reference @ self.reference.T  # [R, R]
        np.fill_diagonal(sim, -np.inf)
        self.loo = 1.0 - sim.max(1)  # [R] each reference picture's distance to its nearest other one
        self.threshold = float(max(self.margin * self.loo.max(), 1e-6))

    def distance(self, features: np.ndarray) -> np.ndarray:
        """[B] distance (1 - cosine) of each feature vector [B, D] to its nearest reference picture."""
        f = np.asarray(features, dtype=np.float32)
        f = f / np.linalg.norm(f, axis=-1, keepdims=True).clip(min=1e-12)
        return 1.0 - (f @ self.reference.T).max(-1)

    def ratio(self, features: np.ndarray) -> np.ndarray:
        """[B] distance / threshold: above 1, the picture is farther from every reference picture than any of
        them is from the rest."""
        return self.distance(features) / self.threshold

    @classmethod
    def from_images(cls, pred, images: Sequence[Any], source: str = "", chunk: int = 64) -> Familiarity:
        feats = [pred.image_features(list(images[i : i + chunk]), cache=False) for i in range(0, len(images), chunk)]
        return cls(np.concatenate(feats), source=source)

    @classmethod
    def from_data(cls, pred, data_dir: str | Path, split: str = "train", n: int = 256, seed: int = 0) -> Familiarity:
        """The reference of `n` pictures drawn (seeded) from `split` of the data folder the model was trained
        on (any format `vqa.data.readers.formats.load_split` reads)."""
        from ..data.readers.formats import load_split

        images = sorted(load_split(data_dir, split, quiet=True).images())
        if len(images) < 2:
            raise InputError(f"{data_dir}: split {split!r} has {len(images)} pictures; a reference needs 2")
        rng = np.random.default_rng(seed)
        pick = [images[i] for i in sorted(rng.choice(len(images), size=min(n, len(images)), replace=False))]
        return cls.from_images(pred, pick, source=f"{len(pick)} pictures of {Path(data_dir).name}/{split}")


__all__ = ["Familiarity"]
