"""The built-in Glyphs set: written characters, a kind of picture unlike the pretraining corpus.

Why: the tiny model is pretrained on the corpus (`vqa pretrain`: drawn geometric objects); a fine-tuning gain
on Shapes or Scenes, both drawn geometric objects too, may only show that the corpus looks like them. Glyphs
asks the same six question families (so `vqa eval`'s table lines up) about 1-4 characters (A-Z, 0-9, &, ?, #)
drawn with a real font renderer: Pillow's built-in FreeType font (`ImageFont.load_default(size=N)`, Pillow >=
10.1; no system font, so a build is the same on every machine), in 6 inks, solid, bold or outlined, turned by
up to 20 degrees, on paper, parchment, lined or graph paper, a grainy photo or a two-tone card
(`glyphs_layout`, `glyphs_font`, `glyphs_render`), with words of its own (`glyphs_text`). Built and written
by `generator` as the other sets are: byte-identical for a seed. A mirrored K is not a K: the set is marked
mirror-unsafe and `vqa train --hflip` refuses it. docs/glyphs.md says more.
"""

from __future__ import annotations

from pathlib import Path

from . import generator
from .glyphs_layout import make_scene
from .glyphs_render import object_box, render_job
from .glyphs_text import N_ANSWERS, candidates, make_captions

GLYPHS_SET = generator.SyntheticSet(
    name="Glyphs", prefix="glyphs", make_scene=make_scene, candidates=candidates, make_captions=make_captions,
    render_job=render_job, n_answers=N_ANSWERS, scene_keys=("page", "line", "texture_seed", "objects"),
    object_box=object_box, mirror_safe=False,  # a mirrored character is another character, or none
)


def build_split(split: str, n: int, side: int, seed: int, per_family: int = 1) -> dict:
    """Scenes, questions and captions of one split (no images)."""
    return generator.build_split(GLYPHS_SET, split, n, side, seed, per_family=per_family)


def generate_glyphs(
    out_dir: str | Path, n_train: int = 10000, n_val: int = 1000, size: int = 64, seed: int = 0,
    progress: bool = True, workers: int | None = None, questions_per_family: int = 1,
) -> dict:
    """Build the Glyphs set in `out_dir` (as `generate_shapes` builds Shapes); returns the question-only prior
    baselines per split and family. Counts and answer histograms go to `glyphs_info.json`."""
    return generator.generate(GLYPHS_SET, out_dir, n_train, n_val, size, seed, progress, workers, questions_per_family)
