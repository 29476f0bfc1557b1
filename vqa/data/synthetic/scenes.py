"""The built-in Scenes set: a second synthetic set, to check a training recipe on before trusting a Shapes result.

Why: a recipe tuned while watching Shapes may have learned Shapes rather than the task. Scenes asks the same six
question families (so `vqa eval`'s table lines up) about other pictures in other words: another renderer
(outlined, rotated polygons of 6 other kinds and 6 other colours, continuous sizes, patterned backgrounds and
clutter: `scenes_layout`, `scenes_render`) and other templates and captions (`scenes_text`). It is built and
written like Shapes (`generator`): the VQA v2 + COCO layout, answers balanced per question string,
the same image side and split sizes by default, byte-identical for a seed. docs/scenes.md says more.
"""

from __future__ import annotations

from pathlib import Path

from . import generator
from .scenes_layout import make_scene
from .scenes_render import object_box, render_job
from .scenes_text import N_ANSWERS, candidates, make_captions

SCENES_SET = generator.SyntheticSet(
    name="Scenes", prefix="scenes", make_scene=make_scene, candidates=candidates, make_captions=make_captions,
    render_job=render_job, n_answers=N_ANSWERS,
    scene_keys=("background", "style", "clutter", "texture_seed", "objects"),
    object_box=object_box,  # the scenes file keeps the boxes (and the texture seed) for grounding / consistency
)


def build_split(split: str, n: int, side: int, seed: int, per_family: int = 1) -> dict:
    """Scenes, questions and captions of one split (no images)."""
    return generator.build_split(SCENES_SET, split, n, side, seed, per_family=per_family)


def generate_scenes(
    out_dir: str | Path, n_train: int = 10000, n_val: int = 1000, size: int = 64, seed: int = 0,
    progress: bool = True, workers: int | None = None, questions_per_family: int = 1,
) -> dict:
    """Build the Scenes set in `out_dir` (as `generate_shapes` builds Shapes); returns the question-only prior
    baselines per split and family. Counts and answer histograms go to `scenes_info.json`."""
    return generator.generate(SCENES_SET, out_dir, n_train, n_val, size, seed, progress, workers, questions_per_family)
