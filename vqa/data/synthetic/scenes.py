"""The built-in Scenes set: a second synthetic set, to check a training recipe on before trusting a Shapes result.

Why: a recipe tuned while watching Shapes may have learned Shapes rather than the task. Scenes asks the same six
question families (so `vqa eval`'s table lines up) about other pictures in other words: another renderer
(outlined, rotated polygons of 6 other kinds and 6 other colours, continuous sizes, patterned backgrounds and
clutter: `scenes_layout`, `scenes_render`) and other templates and captions (`scenes_text`). It is built and
written like Shapes (`generator`): the VQA v2 + COCO layout, answers balanced per question string,
the same image side and split sizes by default, byte-identical for a seed. docs/scenes.md says more.
"""

from __future__ import annotations

from functools import partial

from . import generator
from .scenes_layout import make_scene
from .scenes_render import object_box, render
from .scenes_text import N_ANSWERS, candidates, make_captions

SCENES_SET = generator.SyntheticSet(
    name="Scenes", prefix="scenes", make_scene=make_scene, candidates=candidates, make_captions=make_captions,
    render=render, n_answers=N_ANSWERS,
    scene_keys=("background", "style", "clutter", "texture_seed", "objects"),
    object_box=object_box,  # the scenes file keeps the boxes (and the texture seed) for grounding / consistency
)
build_split = partial(generator.build_split, SCENES_SET)  # (split, n, side, seed, ...): as Shapes' build_split
generate_scenes = partial(generator.generate, SCENES_SET)  # (out_dir, n_train=10000, ...): as generate_shapes
