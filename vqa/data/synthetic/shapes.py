"""The built-in Shapes set: synthetic scenes with questions that need the image, written as VQA v2 + COCO.

Why: a fresh machine has no data set; Shapes gives training, tests and the demo something real to learn, in
the same files as VQA v2 / COCO captions, so one loader path serves it and real data.

Scenes: 1-6 objects (4 shapes, 6 colours, 2 sizes) at random non-overlapping positions on a varied
background (3 grey levels x plain / gradient / noise), drawn 4x supersampled and area-downsampled.
Questions: one per family per image (6; a family with nothing askable is replaced by another). Each
question is chosen among the scene's valid candidates so that, per question string, answers stay as
uniform as possible: a model that ignores the image scores about chance (the prior table printed at the end).
Referring expressions always pick out exactly one object; spatial relations compare centres and need a
margin of 10% of the image side. Everything derives from `seed`: two builds are byte-identical.
"""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from . import generator
from .generator import prior_baselines
from .shapes_layout import make_scene
from .shapes_render import object_box, render_job
from .shapes_text import N_ANSWERS, candidates, make_captions

SHAPES_SET = generator.SyntheticSet(
    name="Shapes", prefix="shapes", make_scene=make_scene, candidates=candidates, make_captions=make_captions,
    render_job=render_job, n_answers=N_ANSWERS, scene_keys=("background", "style", "texture_seed", "objects"),
    object_box=object_box,  # the scenes file keeps the boxes (and the texture seed) for grounding / consistency
)


def make_scenes(split: str, n: int, side: int, seed: int) -> list[dict]:
    """The scenes of a split; image i's scene depends only on (seed, split, i)."""
    return generator.make_scenes(SHAPES_SET, split, n, side, seed)


def build_split(split: str, n: int, side: int, seed: int, bar: tqdm | None = None,
                scenes: list[dict] | None = None, per_family: int = 1) -> dict:
    """Scenes, questions and captions of one split (no images)."""
    return generator.build_split(SHAPES_SET, split, n, side, seed, bar, scenes, per_family)


def generate_shapes(
    out_dir: str | Path, n_train: int = 10000, n_val: int = 1000, size: int = 64, seed: int = 0,
    progress: bool = True, workers: int | None = None, questions_per_family: int = 1,
) -> dict:
    """Build the Shapes set in `out_dir`; returns the question-only prior baselines
    {split: {family: {questions, prior_accuracy, majority_accuracy}}}: train scored in-sample, val with the
    priors learned on train. Counts and answer histograms go to `shapes_info.json`."""
    return generator.generate(SHAPES_SET, out_dir, n_train, n_val, size, seed, progress, workers, questions_per_family)


__all__ = ["SHAPES_SET", "build_split", "generate_shapes", "make_scenes", "prior_baselines"]
