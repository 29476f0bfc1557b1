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

from functools import partial

from . import generator
from .glyphs_layout import make_scene
from .glyphs_render import object_box, render
from .glyphs_text import N_ANSWERS, candidates, make_captions

GLYPHS_SET = generator.SyntheticSet(
    name="Glyphs", prefix="glyphs", make_scene=make_scene, candidates=candidates, make_captions=make_captions,
    render=render, n_answers=N_ANSWERS, scene_keys=("page", "line", "texture_seed", "objects"),
    object_box=object_box, mirror_safe=False,  # a mirrored character is another character, or none
)
build_split = partial(generator.build_split, GLYPHS_SET)  # (split, n, side, seed, ...): as Shapes' build_split
generate_glyphs = partial(generator.generate, GLYPHS_SET)  # (out_dir, n_train=10000, ...): as generate_shapes
