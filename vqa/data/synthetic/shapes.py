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

from functools import partial

from . import generator
from .generator import prior_baselines
from .shapes_layout import make_scene
from .shapes_render import object_box, render
from .shapes_text import N_ANSWERS, candidates, make_captions

SHAPES_SET = generator.SyntheticSet(
    name="Shapes", prefix="shapes", make_scene=make_scene, candidates=candidates, make_captions=make_captions,
    render=render, n_answers=N_ANSWERS, scene_keys=("background", "style", "texture_seed", "objects"),
    object_box=object_box,  # the scenes file keeps the boxes (and the texture seed) for grounding / consistency
)
# (split, n, side, seed, ...) -> the split's scenes, questions and captions (no images)
build_split = partial(generator.build_split, SHAPES_SET)
# (out_dir, n_train=10000, n_val=1000, size=64, seed=0, ...): `generator.generate` for Shapes
generate_shapes = partial(generator.generate, SHAPES_SET)

__all__ = ["SHAPES_SET", "build_split", "generate_shapes", "prior_baselines"]
