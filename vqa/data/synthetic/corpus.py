"""The pretraining corpus: procedurally generated pictures, broader than Shapes and Scenes and sharing none of
their scenes, with dense captions, relation statements and questions, written as VQA v2 + COCO captions so
that `vqa train` (and `vqa pretrain`) reads it like any data folder.

Scenes: `corpus_layout` (12 kinds, 10 colours, 5 fills, continuous sizes, rotations, overlaps, 7 backgrounds x
6 patterns, 4 drawing styles); pictures: `corpus_render`; words: `corpus_text`. Built and written by
`generator` as the other synthetic sets are: byte-identical for a seed. docs/pretraining.md says more.
"""

from __future__ import annotations

from . import generator
from .corpus_layout import make_scene
from .corpus_render import object_box, render
from .corpus_text import N_ANSWERS, candidates, make_captions

CORPUS_SET = generator.SyntheticSet(
    name="Corpus", prefix="corpus", make_scene=make_scene, candidates=candidates,
    make_captions=make_captions, render=render, n_answers=N_ANSWERS,
    scene_keys=("background", "pattern", "style", "objects"),
    object_box=object_box,  # the scenes file keeps the boxes: pretraining's grounding loss (vqa.data.regions)
)

